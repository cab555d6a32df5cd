//! `gmlp-onnx build`: a model from a preset (with overrides) or a trained checkpoint,
//! written atomically, optionally validated.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gmlp_onnx::checkpoint::{save_native, Import, ImportHints};
use gmlp_onnx::gmlp::emit::StateScatter;
use gmlp_onnx::gmlp::export::{export_for, Export};
use gmlp_onnx::gmlp::targets::BuildTarget;
use gmlp_onnx::gmlp::{preset, GateAct, GmlpConfig, SeededInit, SequenceMode, Task, WeightSource};
use gmlp_onnx::onnx::reader::read_model;
use gmlp_onnx::onnx::writer::{data_file_name, write_model_with, ExternalData, Written};
use gmlp_onnx::runtime::ModelFile;
use gmlp_onnx::serve::triton::{check_target, write_repository_file, TritonOptions};
use gmlp_onnx::validate::ValidateOptions;
use gmlp_onnx::Error;

use crate::cli::distinct;
use crate::cli::genai::print_folder;
use crate::cli::progress::{progress_bar, validate_with_spinner};
use crate::cli::triton::{file_stem, print_repository};
use crate::cli::validate::finish_validation;
use gmlp_onnx::gmlp::metadata::END_TOKEN_KEY;
use gmlp_onnx::serve::genai::{
    check_target as check_genai_target, end_token_for, write_folder_file, GenaiOptions,
};

mod args;
pub use args::*;

fn apply_overrides(cfg: &mut GmlpConfig, a: &BuildArgs, preset_name: &str) -> anyhow::Result<()> {
    let set = |dst: &mut usize, v: Option<usize>| {
        if let Some(v) = v {
            *dst = v;
        }
    };
    set(&mut cfg.layers, a.layers);
    set(&mut cfg.d_model, a.d_model);
    set(&mut cfg.d_ffn, a.d_ffn);
    if let Some(attn) = a.attn_dim {
        cfg.attn_dim = (attn > 0).then_some(attn);
    }
    cfg.causal |= a.causal;
    if let Some(s) = a.spatial {
        cfg.spatial = s;
    }
    match &mut cfg.task {
        Task::Tokens {
            vocab_size,
            seq_len,
            ..
        } => {
            let vision_only = [
                ("--num-classes", a.num_classes),
                ("--image-size", a.image_size),
                ("--patch-size", a.patch_size),
                ("--in-chans", a.in_chans),
            ];
            if let Some((flag, _)) = vision_only.iter().find(|(_, v)| v.is_some()) {
                anyhow::bail!(Error::InvalidArgument(format!(
                    "{flag} applies to vision presets, and {preset_name} is a token preset"
                )));
            }
            set(vocab_size, a.vocab_size);
            set(seq_len, a.seq_len);
        }
        Task::Vision {
            image_size,
            patch_size,
            in_chans,
            num_classes,
        } => {
            let token_only = [("--seq-len", a.seq_len), ("--vocab-size", a.vocab_size)];
            if let Some((flag, _)) = token_only.iter().find(|(_, v)| v.is_some()) {
                anyhow::bail!(Error::InvalidArgument(format!(
                    "{flag} applies to token presets, and {preset_name} is a vision preset (use --image-size / --patch-size)"
                )));
            }
            set(image_size, a.image_size);
            set(patch_size, a.patch_size);
            set(in_chans, a.in_chans);
            set(num_classes, a.num_classes);
        }
        Task::Backbone { seq_len } => set(seq_len, a.seq_len),
    }
    Ok(())
}

/// The configuration, weights and their description for a build from a checkpoint.
fn from_checkpoint(path: &Path, a: &BuildArgs) -> anyhow::Result<ModelSource> {
    let architecture_flags = [
        ("--layers", a.layers),
        ("--d-model", a.d_model),
        ("--d-ffn", a.d_ffn),
        ("--attn-dim", a.attn_dim),
        ("--vocab-size", a.vocab_size),
        ("--num-classes", a.num_classes),
    ];
    if let Some((flag, _)) = architecture_flags.iter().find(|(_, v)| v.is_some()) {
        anyhow::bail!(Error::InvalidArgument(format!(
            "{flag} cannot be combined with --weights: the architecture is read from the checkpoint"
        )));
    }
    let toeplitz_tol = a
        .toeplitz_tol
        .unwrap_or(gmlp_onnx::checkpoint::TOEPLITZ_TOLERANCE);
    if !(toeplitz_tol.is_finite() && toeplitz_tol >= 0.0) {
        anyhow::bail!(Error::InvalidArgument(
            "--toeplitz-tol must be a finite number >= 0".into()
        ));
    }
    let hints = ImportHints {
        format: a.weights_format.0,
        causal: a.causal,
        shift_tokens: a.shift_tokens,
        in_chans: a.in_chans,
        image_size: a.image_size,
        patch_size: a.patch_size,
        spatial: a.spatial,
        allow_unused: a.allow_unused,
        seq_len: a.seq_len,
        gate_act: a.gate_act,
        toeplitz_tolerance: toeplitz_tol,
    };
    let import = Import::open(path, &hints)?;
    if let Some(n) = a.seq_len {
        let stored = import.config.seq_len();
        if stored != n {
            anyhow::bail!(Error::InvalidArgument(format!(
                "--seq-len {n} disagrees with the checkpoint, whose spatial weights have {stored} tokens (--seq-len is for checkpoints that do not show it)"
            )));
        }
    }
    let description = format!(
        "imported from {} ({} layout{})",
        path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into_owned()
        ),
        import.format.name(),
        if import.unused.is_empty() {
            String::new()
        } else {
            format!(", {} tensors unused", import.unused.len())
        }
    );
    let mut config = import.config.clone();
    if a.spatial.is_none() {
        config.spatial = a.target.spatial_for(config.spatial);
    }
    let weights: Arc<dyn WeightSource> = Arc::new(import.weights(&config));
    Ok(ModelSource {
        cfg: config,
        weights,
        description,
        preset_name: None,
    })
}

/// Refuses output paths that collide with each other or with the input before anything
/// is read or written (each file is still checked again when it is created).
fn check_output_paths(a: &BuildArgs) -> anyhow::Result<()> {
    let data_file = data_file_name(&a.output).map(|name| a.output.with_file_name(name))?;
    // Compared after resolving the folder (and the file itself when it exists), so that
    // `./m.onnx`, `dir/../m.onnx` and a symlink to it are all the same file.
    let resolved = |p: &Path| {
        p.canonicalize().ok().or_else(|| {
            let dir = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            Some(dir.canonicalize().ok()?.join(p.file_name()?))
        })
    };
    let same = |x: &Path, y: &Path| {
        x == y || matches!((resolved(x), resolved(y)), (Some(p), Some(q)) if p == q)
    };
    if let Some(saved) = &a.save_weights {
        if same(saved, &a.output) || same(saved, &data_file) {
            anyhow::bail!(Error::InvalidArgument(format!(
                "--save-weights {} and the model output name the same file",
                saved.display()
            )));
        }
        if let Some(weights) = &a.weights {
            if same(saved, weights) {
                anyhow::bail!(Error::InvalidArgument(format!(
                    "--save-weights {} would overwrite the --weights input",
                    saved.display()
                )));
            }
        }
    }
    if let Some(weights) = &a.weights {
        if same(weights, &a.output) || same(weights, &data_file) {
            anyhow::bail!(Error::InvalidArgument(format!(
                "-o {} would overwrite the --weights input",
                a.output.display()
            )));
        }
    }
    Ok(())
}

/// The Triton repository to publish into with its options, checked before anything is
/// built (or `None`, refusing Triton options given without `--triton-repo`).
fn triton_plan(a: &BuildArgs) -> anyhow::Result<Option<(PathBuf, TritonOptions)>> {
    let Some(repo) = &a.triton_repo else {
        if let Some(flag) = a.triton.any_given() {
            anyhow::bail!(Error::InvalidArgument(format!(
                "{flag} applies to --triton-repo"
            )));
        }
        return Ok(None);
    };
    let default_name = a.preset.clone().unwrap_or_else(|| file_stem(&a.output));
    let options = a.triton.options(&default_name);
    check_target(repo, &options)?;
    Ok(Some((repo.clone(), options)))
}

/// What a build starts from: the configuration, the weights, their description, and the
/// preset's name when there is one.
struct ModelSource {
    cfg: GmlpConfig,
    weights: Arc<dyn WeightSource>,
    description: String,
    preset_name: Option<&'static str>,
}

/// A preset with seeded weights (`--preset NAME`, architecture overrides applied).
fn from_preset(name: &str, a: &BuildArgs, target: &BuildTarget) -> anyhow::Result<ModelSource> {
    if a.shift_tokens > 0 {
        anyhow::bail!(Error::InvalidArgument(
            "--shift-tokens applies to --weights (g-mlp-pytorch checkpoints)".into()
        ));
    }
    let import_only = [
        ("--toeplitz-tol", a.toeplitz_tol.is_some()),
        ("--allow-unused", a.allow_unused),
        ("--weights-format", a.weights_format.0.is_some()),
        ("--gate-act", a.gate_act != GateAct::Identity),
    ];
    if let Some((flag, _)) = import_only.iter().find(|(_, given)| *given) {
        anyhow::bail!(Error::InvalidArgument(format!(
            "{flag} applies to --weights (it describes the checkpoint)"
        )));
    }
    let p = preset(name)?;
    let mut cfg = p.config.clone();
    cfg.spatial = target.target.spatial_for(cfg.spatial);
    apply_overrides(&mut cfg, a, name)?;
    let scheme = a.init;
    let description = format!("seeded init (scheme {}, seed {})", scheme.name(), a.seed);
    Ok(ModelSource {
        cfg,
        weights: Arc::new(SeededInit {
            seed: a.seed,
            scheme,
        }),
        description,
        preset_name: Some(p.name),
    })
}

/// The files a build has written so far. A later step that fails removes them all: a
/// build leaves its complete result or nothing.
struct WrittenSoFar(Vec<PathBuf>);

impl WrittenSoFar {
    /// The model file `output` and its external data file, if any.
    fn of(output: &Path, written: &Written) -> WrittenSoFar {
        let mut files = vec![output.to_path_buf()];
        files.extend(written.data_file.iter().map(|(path, _)| path.clone()));
        WrittenSoFar(files)
    }

    /// `result`, after removing every file written so far if it is an error.
    fn or_remove<T, E>(&self, result: Result<T, E>) -> Result<T, E> {
        if result.is_err() {
            for path in &self.0 {
                let _ = std::fs::remove_file(path);
            }
        }
        result
    }
}

/// Writes `model` to `output`, with a progress bar in bytes of weights written.
fn write_with_progress(
    model: &Export,
    output: &Path,
    layout: ExternalData,
    quiet: bool,
) -> anyhow::Result<Written> {
    // Progress in bytes of weights written (tensor k done → the first k tensors' bytes).
    let done_bytes: Vec<u64> = model
        .graph
        .initializers
        .iter()
        .scan(0u64, |acc, i| {
            *acc += i.byte_len() as u64;
            Some(*acc)
        })
        .collect();
    let bar = progress_bar(model.graph.initializer_bytes(), quiet, "writing weights");
    let written = write_model_with(&model.graph, &model.info, output, layout, |k, _| {
        bar.set_position(done_bytes[k - 1])
    })?;
    bar.finish_and_clear();
    Ok(written)
}

/// Runs `build`: checks, the model source, the graph, the file (with its external data),
/// then the optional native weights, Triton repository and validation.
pub fn run(a: BuildArgs) -> anyhow::Result<()> {
    if a.tolerance.given() && !a.validate {
        anyhow::bail!(Error::InvalidArgument(
            "--rtol and --atol bound the comparison of --validate; add --validate".into()
        ));
    }
    check_output_paths(&a)?;
    let triton = triton_plan(&a)?;
    if let Some(dir) = &a.genai_dir {
        if a.with_past.is_none() {
            anyhow::bail!(Error::InvalidArgument(
                "--genai-dir needs --with-past (onnxruntime-genai runs the static state)".into()
            ));
        }
        check_genai_target(dir)?;
    }
    let target = BuildTarget::resolve(a.target, a.opset)?;
    let tolerance = a.tolerance.request()?;
    // clap requires exactly one of --preset and --weights.
    let ModelSource {
        cfg,
        weights: source,
        description,
        preset_name,
    } = match &a.weights {
        Some(path) => from_checkpoint(path, &a)?,
        None => from_preset(a.preset.as_deref().unwrap_or_default(), &a, &target)?,
    };
    let mut cfg = cfg;
    cfg.dtype = a.dtype;
    target.check(cfg.spatial)?;
    target.check_dtype(cfg.dtype)?;
    let mode = sequence_mode(&a, &target, &cfg)?;
    let mut model = export_for(
        &cfg,
        source.clone(),
        &description,
        preset_name,
        &target,
        mode,
    )?;
    record_end_token(&a, &cfg, &mut model)?;
    let layout = if a.external_data {
        ExternalData::Always
    } else {
        ExternalData::Auto
    };
    let written = write_with_progress(&model, &a.output, layout, a.quiet)?;
    let summary_line = summary(&a, &cfg, &target, mode, &model, &written);
    drop(model);
    // What reads the file back (the Triton repository, the genai folder, validate) gets it
    // decoded once, here.
    let reads_back = a.validate || triton.is_some() || a.genai_dir.is_some();
    let decoded = if reads_back {
        Some(WrittenSoFar::of(&a.output, &written).or_remove(read_model(&a.output))?)
    } else {
        None
    };
    let file = ModelFile {
        path: &a.output,
        decoded: decoded.as_ref(),
    };
    write_beside(&a, &cfg, source.as_ref(), triton.as_ref(), &written, file)?;
    println!("{}", summary_line);
    if a.validate {
        let mut options = ValidateOptions::new(distinct(&a.runtimes.runtimes));
        options.batch = 1;
        options.runtime = a.ort.runtime_options();
        options.tolerance = tolerance;
        let report = validate_with_spinner(file, &options, a.quiet)?;
        finish_validation(report, None, None)?;
    }
    Ok(())
}

/// The sequence form the flags ask for (`--with-past [static|growing]`, `--fixed-seq`, or
/// the target's default), checked against the model and `--genai-dir`; a plain
/// `--with-past` says on stderr which form it built.
fn sequence_mode(
    a: &BuildArgs,
    target: &BuildTarget,
    cfg: &GmlpConfig,
) -> anyhow::Result<SequenceMode> {
    let (mode, past_note) = match a.with_past {
        Some(Some(PastArg::Static)) => (SequenceMode::Static, None),
        Some(Some(PastArg::Growing)) => (SequenceMode::Growing, None),
        Some(None) => {
            let (mode, note) = target.target.with_past_for(cfg);
            (mode, Some(note))
        }
        None if a.fixed_seq => (SequenceMode::Fixed, None),
        None => (target.target.sequence_for(cfg), None),
    };
    mode.check(cfg)?;
    if a.genai_dir.is_some() && mode != SequenceMode::Static {
        anyhow::bail!(Error::InvalidArgument(
            "--genai-dir needs the static state (--with-past or --with-past static): onnxruntime-genai cannot share a growing state in place".into()
        ));
    }
    if let Some(note) = past_note {
        eprintln!("note: {}", note.render(super::setting_flag));
    }
    Ok(mode)
}

/// Records `--eos-token-id` in `model`'s metadata, refusing it for a model without token
/// ids or an id outside the vocabulary.
fn record_end_token(a: &BuildArgs, cfg: &GmlpConfig, model: &mut Export) -> anyhow::Result<()> {
    if let Some(id) = a.eos_token_id {
        let vocab = match cfg.task {
            Task::Tokens { vocab_size, .. } if cfg.causal => vocab_size,
            _ => anyhow::bail!(Error::InvalidArgument(
                "--eos-token-id applies to causal token models".into()
            )),
        };
        end_token_for(None, Some(id), vocab).map_err(|_| {
            Error::InvalidArgument(format!(
                "--eos-token-id {id} is not one of the model's {vocab} token ids"
            ))
        })?;
        model
            .info
            .metadata
            .push((END_TOKEN_KEY.to_string(), id.to_string()));
    }
    Ok(())
}

/// Writes what goes beside the model (`--save-weights`, `--triton-repo`, `--genai-dir`),
/// removing every file written so far, the model's included, if one fails.
fn write_beside(
    a: &BuildArgs,
    cfg: &GmlpConfig,
    source: &dyn WeightSource,
    triton: Option<&(PathBuf, TritonOptions)>,
    written: &Written,
    file: ModelFile,
) -> anyhow::Result<()> {
    let mut written_so_far = WrittenSoFar::of(&a.output, written);
    if let Some(path) = &a.save_weights {
        written_so_far.or_remove(save_native(path, cfg, source))?;
        written_so_far.0.push(path.clone());
        println!("wrote {} (native layout)", path.display());
    }
    if let Some((repo, options)) = triton {
        let w = written_so_far.or_remove(write_repository_file(file, repo, options))?;
        print_repository(&w);
    }
    if let Some(dir) = &a.genai_dir {
        let w = written_so_far.or_remove(write_folder_file(file, dir, &GenaiOptions::default()))?;
        print_folder(&w);
    }
    Ok(())
}

/// The line that says what was written: sizes, counts, target, opset, spatial form and,
/// for a model with state, its form (a static state's scatter as the emitter chose it).
fn summary(
    a: &BuildArgs,
    cfg: &GmlpConfig,
    target: &BuildTarget,
    mode: SequenceMode,
    model: &Export,
    written: &Written,
) -> String {
    let c = &model.counts;
    let data_note = match &written.data_file {
        Some((path, len)) => format!(
            " + {} ({:.1} MB of external data)",
            path.display(),
            *len as f64 / 1e6
        ),
        None => String::new(),
    };
    let state = match mode {
        SequenceMode::Static => format!(
            ", static state ({})",
            StateScatter::at_opset(target.opset).op_type()
        ),
        SequenceMode::Growing => ", growing state".to_string(),
        SequenceMode::Fixed | SequenceMode::Variable => String::new(),
    };
    format!(
        "wrote {} ({:.1} MB){data_note}: {} stored parameters, {} per example (paper convention), target {}, opset {}, spatial {}{state}",
        a.output.display(),
        written.model_bytes as f64 / 1e6,
        c.stored_params,
        gmlp_onnx::inspect::human_flops(c.flops),
        target.target.name(),
        target.opset,
        cfg.spatial.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use gmlp_onnx::onnx::reader::files_decoded;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: BuildArgs,
    }

    /// `build --validate --triton-repo --genai-dir` decodes the file it wrote once, for the
    /// Triton repository, the genai folder and every check of validate together.
    #[test]
    fn build_decodes_its_output_once_for_validate_triton_and_genai() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        let runtimes = if cfg!(feature = "test-onnxruntime") {
            "tract,ort-cpu"
        } else {
            "tract"
        };
        let (out, repo, genai) = (path("m.onnx"), path("repo"), path("genai"));
        let a = Wrapper::parse_from([
            "x",
            "--preset",
            "amlp-base",
            "--layers",
            "1",
            "--seq-len",
            "32",
            "--causal",
            "--with-past",
            "-q",
            "-o",
            &out,
            "--validate",
            "--runtimes",
            runtimes,
            "--triton-repo",
            &repo,
            "--genai-dir",
            &genai,
        ])
        .args;
        let before = files_decoded();
        run(a).unwrap();
        assert_eq!(files_decoded() - before, 1);
        assert!(dir.path().join("genai/genai_config.json").is_file());
        assert!(dir.path().join("repo").is_dir());
    }
}
