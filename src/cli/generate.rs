//! `gmlp-onnx generate`: text generation with a causal token model on any runtime. A
//! `--with-past` model runs the prompt once and then one token per step, its state fed
//! back; a variable-length model without state re-runs the whole prefix for every token
//! (slower, the comparison the state is for). `--prompts-file` decodes several prompts as
//! one batch (see [`batch`]).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ndarray::Array2;
use serde::Serialize;

use gmlp_onnx::gmlp::sampling::Sampler;
use gmlp_onnx::runtime::decoder::{Decoder, DecodingModel};
use gmlp_onnx::runtime::{RuntimeKind, RuntimeOptions};
use gmlp_onnx::Error;

use crate::cli::{distinct, Disagreement};

mod batch;

#[derive(Args)]
pub struct GenerateArgs {
    /// A causal token model built with --with-past (or with a variable length).
    pub model: PathBuf,
    /// Prompt as comma-separated token ids.
    #[arg(
        long,
        conflicts_with_all = ["prompt_text", "prompts_file"],
        required_unless_present_any = ["prompt_text", "prompts_file"]
    )]
    pub prompt_ids: Option<String>,
    /// Prompt as text, for byte-level vocabularies (256 tokens: one token per UTF-8 byte).
    #[arg(long, conflicts_with = "prompts_file")]
    pub prompt_text: Option<String>,
    /// Several prompts decoded together as one batch, one per line as comma-separated
    /// token ids (blank lines skipped); of different lengths with a static-state model
    /// (each sequence at its own position), of one length otherwise.
    #[arg(long)]
    pub prompts_file: Option<PathBuf>,
    /// Let ONNX Runtime copy a static-state model's state every step instead of writing
    /// it in place (for measuring what writing in place saves).
    #[arg(long)]
    pub copy_state: bool,
    /// Tokens to generate [default: until the model's n positions are full].
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Sampling temperature; 0 = greedy [default: 0, or 1 with --top-k].
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Sample among the k most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Seed of the sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Runtime.
    #[arg(long, value_enum, default_value = "ort-cpu")]
    pub runtime: RuntimeKind,
    /// Run each of these runtimes (comma-separated) and fail if their tokens differ.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub compare: Option<Vec<RuntimeKind>>,
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, else the Python onnxruntime package).
    #[arg(long)]
    pub ort_lib: Option<PathBuf>,
    /// ONNX Runtime's intra-op threads (0: its default, one per physical core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress line.
    #[arg(long, short)]
    pub quiet: bool,
}

/// What one runtime generated, with its timings.
#[derive(Serialize)]
struct Generation {
    runtime: String,
    mode: &'static str,
    state_in_place: bool,
    prompt_tokens: usize,
    tokens: Vec<i64>,
    prefill_ms: f64,
    prefill_tokens_per_s: f64,
    steps: usize,
    steps_ms: f64,
    step_median_ms: Option<f64>,
    step_tokens_per_s: Option<f64>,
    /// What the runtime did differently from running the file as it is (tract's
    /// dequantized 8-bit `MatMulNBits`), also printed on stderr.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// How `generate` opens a runtime: ONNX Runtime with the given library and threads; tract
/// runs the 8-bit `MatMulNBits` nodes it cannot read (the output projections and vocabulary
/// head of int4 files, every projection of int8-weight-only ones) as `MatMul`s on the file's
/// dequantized weights, which [`announce_note`] says.
pub(crate) fn runtime_options(a: &GenerateArgs) -> RuntimeOptions {
    RuntimeOptions {
        ort_library: a.ort_lib.clone(),
        threads: a.threads,
        tract_dequantize_nbits: true,
        ..Default::default()
    }
}

/// The decoder's runtime note on stderr (one line, also with `--quiet`: it says what ran),
/// returned for the JSON result.
pub(crate) fn announce_note(decoder: &Decoder) -> Option<String> {
    let note = decoder.runtime_note()?;
    eprintln!("note: {}: {note}", decoder.runtime_name());
    Some(note)
}

/// The runtimes to generate on: those of `--compare` (each once), else `--runtime`.
fn runtimes(a: &GenerateArgs) -> Vec<RuntimeKind> {
    match &a.compare {
        Some(list) => distinct(list),
        None => vec![a.runtime],
    }
}

/// Comma-separated token ids (`what` names their origin in messages).
fn parse_ids(list: &str, what: &str) -> Result<Vec<i64>, Error> {
    list.split(',')
        .map(|s| {
            s.trim().parse::<i64>().map_err(|_| {
                Error::InvalidArgument(format!("{what}: '{}' is not a token id", s.trim()))
            })
        })
        .collect()
}

fn parse_prompt(a: &GenerateArgs, vocab: usize) -> anyhow::Result<Vec<i64>> {
    let ids: Vec<i64> = match (&a.prompt_ids, &a.prompt_text) {
        (Some(list), _) => parse_ids(list, "--prompt-ids")?,
        (None, Some(text)) => {
            if vocab != 256 {
                anyhow::bail!(Error::InvalidArgument(format!(
                    "--prompt-text needs a byte-level vocabulary of 256 tokens; this model has {vocab} (use --prompt-ids)"
                )));
            }
            text.bytes().map(i64::from).collect()
        }
        (None, None) => anyhow::bail!(Error::InvalidArgument(
            "give --prompt-ids or --prompt-text".into()
        )),
    };
    if ids.is_empty() {
        anyhow::bail!(Error::InvalidArgument("the prompt is empty".into()));
    }
    if let Some(bad) = ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
        anyhow::bail!(Error::InvalidArgument(format!(
            "prompt token id {bad} is outside the vocabulary 0..{vocab}"
        )));
    }
    Ok(ids)
}

fn generate_on(
    kind: RuntimeKind,
    a: &GenerateArgs,
    prompt: &[i64],
    new_tokens: usize,
) -> anyhow::Result<Generation> {
    let mut decoder = Decoder::open(kind, &a.model, &runtime_options(a), 1)?;
    decoder.set_in_place(!a.copy_state);
    let note = announce_note(&decoder);
    let mut sampler = Sampler::new(a.temperature, a.top_k, a.seed)?;
    let target = if a.quiet || a.json {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(new_tokens as u64), target);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tokens {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("generating on {}", kind.name()));
    let started = Instant::now();
    let prompt_ids = Array2::from_shape_vec((1, prompt.len()), prompt.to_vec())?;
    let mut logits = decoder.feed(prompt_ids.view())?;
    let prefill_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut tokens = Vec::with_capacity(new_tokens);
    let mut step_ms = Vec::new();
    while tokens.len() < new_tokens {
        let last = logits.dim().1 - 1;
        let row = logits.slice(ndarray::s![0, last, ..]);
        let next = sampler.pick(row.as_slice().unwrap_or(&row.to_vec())) as i64;
        tokens.push(next);
        bar.set_position(tokens.len() as u64);
        if tokens.len() == new_tokens {
            break;
        }
        let step = Instant::now();
        logits = decoder.feed(Array2::from_elem((1, 1), next).view())?;
        step_ms.push(step.elapsed().as_secs_f64() * 1e3);
    }
    bar.finish_and_clear();
    let steps_ms: f64 = step_ms.iter().sum();
    let mut sorted = step_ms.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Generation {
        runtime: kind.name(),
        mode: decoder.model().info.mode.as_str(),
        state_in_place: decoder.in_place(),
        prompt_tokens: prompt.len(),
        tokens,
        prefill_ms,
        prefill_tokens_per_s: prompt.len() as f64 / (prefill_ms / 1e3),
        steps: step_ms.len(),
        steps_ms,
        step_median_ms: sorted.get(sorted.len() / 2).copied(),
        step_tokens_per_s: (!step_ms.is_empty()).then(|| step_ms.len() as f64 / (steps_ms / 1e3)),
        note,
    })
}

fn show_tokens(tokens: &[i64], vocab: usize) -> String {
    let ids: Vec<String> = tokens.iter().map(i64::to_string).collect();
    let mut s = format!("tokens: {}", ids.join(","));
    if vocab == 256 {
        let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
        s += &format!("\ntext:   {:?}", String::from_utf8_lossy(&bytes));
    }
    s
}

/// Runs `generate`.
pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    let model = DecodingModel::read(&a.model)?;
    if let Some(file) = &a.prompts_file {
        return batch::run(&a, file, &model);
    }
    let n = model.info.max_sequence;
    let prompt = parse_prompt(&a, model.vocab_size)?;
    if prompt.len() > n {
        anyhow::bail!(Error::InvalidArgument(format!(
            "the prompt has {} tokens, more than the model's {n} positions",
            prompt.len()
        )));
    }
    let room = n - prompt.len();
    let new_tokens = match a.max_new_tokens {
        Some(k) if k > room => anyhow::bail!(Error::InvalidArgument(format!(
            "--max-new-tokens {k} would generate past the model's {n} positions ({} prompt tokens leave room for {room})",
            prompt.len()
        ))),
        Some(k) => k,
        None => room,
    };
    let kinds = runtimes(&a);
    Sampler::new(a.temperature, a.top_k, a.seed)?;
    let mut results = Vec::new();
    for kind in kinds {
        results.push(generate_on(kind, &a, &prompt, new_tokens)?);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for g in &results {
            println!("{} ({} model):", g.runtime, g.mode);
            println!("{}", show_tokens(&g.tokens, model.vocab_size));
            println!(
                "prefill: {} tokens in {:.1} ms ({:.0} tokens/s)",
                g.prompt_tokens, g.prefill_ms, g.prefill_tokens_per_s
            );
            match (g.step_median_ms, g.step_tokens_per_s) {
                (Some(median), Some(rate)) => println!(
                    "steps:   {} tokens in {:.1} ms ({rate:.1} tokens/s, median step {median:.2} ms{})",
                    g.steps,
                    g.steps_ms,
                    if model.info.mode.has_state() {
                        ""
                    } else {
                        "; no state: each step re-runs the whole prefix"
                    }
                ),
                _ => println!("steps:   none"),
            }
        }
        if new_tokens < a.max_new_tokens.unwrap_or(usize::MAX) && a.max_new_tokens.is_none() {
            println!("stopped at the model's {n} positions");
        }
    }
    same_tokens(
        results.iter().map(|g| (g.runtime.as_str(), &g.tokens)),
        a.json,
    )
}

/// `--compare`: fails (exit 1) when two runtimes generated different tokens, else says
/// they agree (unless the output is JSON).
fn same_tokens<'a, T: PartialEq + 'a>(
    results: impl Iterator<Item = (&'a str, &'a T)> + Clone,
    json: bool,
) -> anyhow::Result<()> {
    let mut all = results.clone();
    let Some((first_runtime, first_tokens)) = all.next() else {
        return Ok(());
    };
    if let Some((other, _)) = all.find(|(_, tokens)| *tokens != first_tokens) {
        eprintln!("gmlp-onnx: {first_runtime} and {other} generated different tokens");
        return Err(Disagreement.into());
    }
    let runtimes: Vec<&str> = results.map(|(runtime, _)| runtime).collect();
    if runtimes.len() > 1 && !json {
        println!("same tokens in {}", runtimes.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: GenerateArgs,
    }

    fn args(extra: &[&str]) -> GenerateArgs {
        let mut all = vec!["x", "m.onnx"];
        all.extend_from_slice(extra);
        Wrapper::parse_from(all).args
    }

    #[test]
    fn prompts_parse_as_ids_or_bytes_within_the_vocabulary() {
        assert_eq!(
            parse_prompt(&args(&["--prompt-ids", "1, 2,3"]), 10).unwrap(),
            [1, 2, 3]
        );
        assert_eq!(
            parse_prompt(&args(&["--prompt-text", "Hi"]), 256).unwrap(),
            [72, 105]
        );
        let err =
            |extra: &[&str], vocab| parse_prompt(&args(extra), vocab).unwrap_err().to_string();
        assert!(err(&["--prompt-ids", "1,x"], 10).contains("'x' is not a token id"));
        assert!(err(&["--prompt-ids", "1,10"], 10).contains("outside the vocabulary 0..10"));
        assert!(err(&["--prompt-ids=-1"], 10).contains("outside the vocabulary"));
        assert!(err(&["--prompt-text", "Hi"], 50).contains("256 tokens"));
        assert!(err(&["--prompt-text", ""], 256).contains("empty"));
    }
}
