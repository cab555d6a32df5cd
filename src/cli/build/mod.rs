//! `gmlp-onnx build`: a model from a preset (with overrides) or a trained checkpoint,
//! written atomically, optionally validated.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gmlp_onnx::checkpoint::{Checkpoint, Import, ImportHints};
use gmlp_onnx::gmlp::targets::BuildTarget;
use gmlp_onnx::gmlp::{preset, GateAct, GmlpConfig, SeededInit, Task, WeightSource};
use gmlp_onnx::message::Phrase;
use gmlp_onnx::onnx::writer::data_file_name;
use gmlp_onnx::pipeline::{self, Beside, BuildRequest, Built, Event, ModelSource, SequenceChoice};
use gmlp_onnx::runtime::ModelFile;
use gmlp_onnx::serve::genai::check_target as check_genai_target;
use gmlp_onnx::serve::triton::{check_target, TritonOptions};
use gmlp_onnx::validate::{ToleranceRequest, ValidateOptions};
use gmlp_onnx::Error;

use crate::cli::distinct;
use crate::cli::genai::print_folder;
use crate::cli::progress::{progress_bar, validate_with_spinner};
use crate::cli::triton::{file_stem, print_repository};
use crate::cli::validate::finish_validation;

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
                anyhow::bail!(Error::Conflict(format!(
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
                anyhow::bail!(Error::Conflict(format!(
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

/// The configuration, weights and their description for a build from a checkpoint: the
/// file at `path`, or `memory` (tensors a front end holds, `path` its label).
fn from_checkpoint(
    path: &Path,
    memory: Option<Checkpoint>,
    a: &BuildArgs,
) -> anyhow::Result<ModelSource> {
    let architecture_flags = [
        ("--layers", a.layers),
        ("--d-model", a.d_model),
        ("--d-ffn", a.d_ffn),
        ("--attn-dim", a.attn_dim),
        ("--vocab-size", a.vocab_size),
        ("--num-classes", a.num_classes),
    ];
    if let Some((flag, _)) = architecture_flags.iter().find(|(_, v)| v.is_some()) {
        anyhow::bail!(Error::Conflict(format!(
            "{flag} cannot be combined with --weights: the architecture is read from the checkpoint"
        )));
    }
    let toeplitz_tol = a
        .toeplitz_tol
        .unwrap_or(gmlp_onnx::checkpoint::TOEPLITZ_TOLERANCE);
    if !(toeplitz_tol.is_finite() && toeplitz_tol >= 0.0) {
        anyhow::bail!(Error::OutOfRange(
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
    let import = match memory {
        Some(checkpoint) => Import::from_checkpoint(checkpoint, &hints)?,
        None => Import::open(path, &hints)?,
    };
    if let Some(n) = a.seq_len {
        let stored = import.config.seq_len();
        if stored != n {
            anyhow::bail!(Error::ContradictsWeights(format!(
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
        config,
        weights,
        description,
        preset_name: None,
    })
}

/// Refuses output paths that collide with each other or with the input (`weights_file`:
/// `--weights` names a file) before anything is read or written (each file is still
/// checked again when it is created).
fn check_output_paths(a: &BuildArgs, weights_file: bool) -> anyhow::Result<()> {
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
            anyhow::bail!(Error::OutputPath(format!(
                "--save-weights {} and the model output name the same file",
                saved.display()
            )));
        }
        if let Some(weights) = a.weights.as_ref().filter(|_| weights_file) {
            if same(saved, weights) {
                anyhow::bail!(Error::OutputPath(format!(
                    "--save-weights {} would overwrite the --weights input",
                    saved.display()
                )));
            }
        }
    }
    if let Some(weights) = a.weights.as_ref().filter(|_| weights_file) {
        if same(weights, &a.output) || same(weights, &data_file) {
            anyhow::bail!(Error::OutputPath(format!(
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
            anyhow::bail!(Error::Conflict(format!("{flag} applies to --triton-repo")));
        }
        return Ok(None);
    };
    let default_name = a.preset.clone().unwrap_or_else(|| file_stem(&a.output));
    let options = a.triton.options(&default_name);
    check_target(repo, &options)?;
    Ok(Some((repo.clone(), options)))
}

/// A preset with seeded weights (`--preset NAME`, architecture overrides applied).
fn from_preset(name: &str, a: &BuildArgs, target: &BuildTarget) -> anyhow::Result<ModelSource> {
    if a.shift_tokens > 0 {
        anyhow::bail!(Error::Conflict(
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
        anyhow::bail!(Error::Conflict(format!(
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
        config: cfg,
        weights: Arc::new(SeededInit {
            seed: a.seed,
            scheme,
        }),
        description,
        preset_name: Some(p.name),
    })
}

/// A build planned from the flags: what to build it from, and how.
pub struct Plan {
    /// The configuration and weights.
    pub source: ModelSource,
    /// The pipeline's request.
    pub request: BuildRequest,
    /// `--validate`'s comparison bounds (checked), when asked for.
    pub tolerance: ToleranceRequest,
}

/// Checks the flags and plans the build: the model source (a preset, the `--weights`
/// file, or `memory`, tensors a front end holds under the label `--weights` gives) and
/// the pipeline's request.
pub fn plan(a: &BuildArgs, memory: Option<Checkpoint>) -> anyhow::Result<Plan> {
    if a.tolerance.given() && !a.validate {
        anyhow::bail!(Error::Conflict(
            "--rtol and --atol bound the comparison of --validate; add --validate".into()
        ));
    }
    check_output_paths(a, memory.is_none())?;
    let triton = triton_plan(a)?;
    if let Some(dir) = &a.genai_dir {
        if a.with_past.is_none() {
            anyhow::bail!(Error::Conflict(
                "--genai-dir needs --with-past (onnxruntime-genai runs the static state)".into()
            ));
        }
        check_genai_target(dir)?;
    }
    let target = BuildTarget::resolve(a.target, a.opset)?;
    let tolerance = a.tolerance.request()?;
    // clap requires exactly one of --preset and --weights.
    let mut source = match &a.weights {
        Some(path) => from_checkpoint(path, memory, a)?,
        None => from_preset(a.preset.as_deref().unwrap_or_default(), a, &target)?,
    };
    source.config.dtype = a.dtype;
    let sequence = match a.with_past {
        Some(form) => SequenceChoice::WithPast(form),
        None if a.fixed_seq => SequenceChoice::Fixed,
        None => SequenceChoice::Default,
    };
    let request = BuildRequest {
        output: a.output.clone(),
        target,
        sequence,
        end_token: a.eos_token_id,
        external_data: a.external_data,
        save_weights: a.save_weights.clone(),
        triton,
        genai_dir: a.genai_dir.clone(),
        keep_decoded: a.validate,
    };
    Ok(Plan {
        source,
        request,
        tolerance,
    })
}

/// Runs the pipeline of `plan`, with a progress bar in bytes of weights written (none
/// with `quiet`), showing `note` its notes.
pub fn build_with_progress(
    plan: Plan,
    quiet: bool,
    note: &mut dyn FnMut(&Phrase),
) -> anyhow::Result<Built> {
    let mut bar = None;
    let built = pipeline::build(plan.source, &plan.request, &mut |event| match event {
        Event::Note(phrase) => note(phrase),
        Event::Writing(total) => bar = Some(progress_bar(total, quiet, "writing weights")),
        Event::Written(bytes) => {
            if let Some(bar) = &bar {
                bar.set_position(bytes)
            }
        }
        Event::Finished => {
            if let Some(bar) = bar.take() {
                bar.finish_and_clear()
            }
        }
    })?;
    Ok(built)
}

/// Runs `build`: checks, the model source, the pipeline (the graph, the file with its
/// external data, then the optional native weights, Triton repository and genai folder),
/// what was written, then the optional validation.
pub fn run(a: BuildArgs) -> anyhow::Result<()> {
    let plan = plan(&a, None)?;
    let tolerance = plan.tolerance;
    let built = build_with_progress(plan, a.quiet, &mut |note| {
        eprintln!("note: {}", note.render(super::setting_flag))
    })?;
    for beside in &built.beside {
        match beside {
            Beside::NativeWeights(path) => println!("wrote {} (native layout)", path.display()),
            Beside::Triton(w) => print_repository(w),
            Beside::Genai(w) => print_folder(w),
        }
    }
    println!("{}", built.summary);
    if a.validate {
        let file = ModelFile {
            path: &a.output,
            decoded: built.decoded.as_ref(),
        };
        let mut options = ValidateOptions::new(distinct(&a.runtimes.runtimes));
        options.batch = 1;
        options.runtime = a.ort.runtime_options();
        options.tolerance = tolerance;
        let report = validate_with_spinner(file, &options, a.quiet)?;
        finish_validation(report, None, None)?;
    }
    Ok(())
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
