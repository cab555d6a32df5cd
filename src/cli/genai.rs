//! `gmlp-onnx genai`: an onnxruntime-genai model folder from a static-state file (the
//! `--genai-*` flags it shares with `build --genai-dir`).

use std::path::PathBuf;

use clap::Args;
use gmlp_onnx::serve::genai::{write_folder, EndToken, FolderWritten, GenaiOptions};

#[derive(Args)]
pub struct GenaiArgs {
    /// The ONNX model: a causal model built with --with-past (the static state).
    pub model: PathBuf,
    /// The folder to write (created; must be absent or empty): model.onnx, genai_config.json, and a tokenizer for byte-level models.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The token that ends a sequence [default: the model's own (build --eos-token-id), else one added past the vocabulary that the model never emits].
    #[arg(long, value_name = "ID")]
    pub eos_token_id: Option<i64>,
}

/// Prints what was written.
pub fn print_folder(w: &FolderWritten) {
    let end = match w.end_token {
        EndToken::Model(id) => format!("end token {id}"),
        EndToken::Added(id) => format!("end token {id} added (never emitted)"),
    };
    println!(
        "wrote onnxruntime-genai folder {} ({} key/value layers, {end}{}): {}",
        w.dir.display(),
        w.layers.len(),
        if w.tokenizer {
            ", byte-level tokenizer"
        } else {
            ""
        },
        w.files
            .iter()
            .map(|f| f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Runs `genai`.
pub fn run(a: GenaiArgs) -> anyhow::Result<()> {
    let options = GenaiOptions {
        end_token: a.eos_token_id,
    };
    let written = write_folder(&a.model, &a.out, &options)?;
    print_folder(&written);
    Ok(())
}
