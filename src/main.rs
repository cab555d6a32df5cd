//! `gmlp-onnx` command line: build, presets, validate, inspect, triton.
//!
//! Exit codes: 0 success / runtimes agree, 1 runtimes disagree, 2 usage or input error,
//! 3 a requested runtime is unavailable, 101 internal error (a bug: please report it).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use gmlp_onnx::checkpoint::{save_native, Format, Import, ImportHints};
use gmlp_onnx::compare::Tolerance;
use gmlp_onnx::export::{counts, export, DEFAULT_OPSET};
use gmlp_onnx::gmlp::{
    preset, presets, GmlpConfig, InitScheme, Precision, SeededInit, SpatialForm, Task, WeightSource,
};
use gmlp_onnx::model_io::{write_model_with, ExternalData};
use gmlp_onnx::runtime::{RuntimeKind, RuntimeOptions};
use gmlp_onnx::validate::{validate_with_progress, ValidateOptions, ValidationReport};
use gmlp_onnx::Error;

#[derive(Parser)]
#[command(
    name = "gmlp-onnx",
    version,
    about = "Compile gMLP / aMLP (Pay Attention to MLPs) to ONNX and check it in tract and ONNX Runtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build an ONNX model from a preset (with optional overrides) or a trained checkpoint.
    Build(BuildArgs),
    /// List the presets with parameter counts and FLOPs of the graphs they emit, beside the paper's.
    Presets {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run a model on several runtimes with the same inputs and compare the outputs.
    Validate(ValidateArgs),
    /// Describe an ONNX file: opsets, inputs/outputs, parameters, operators, metadata.
    Inspect {
        /// The ONNX model.
        model: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Put an existing ONNX file into a Triton Inference Server model repository.
    Triton(TritonArgs),
}

#[derive(Args)]
struct TritonArgs {
    /// The ONNX model.
    model: PathBuf,
    /// The model repository (created if missing): writes REPO/NAME/config.pbtxt and REPO/NAME/VERSION/model.onnx.
    #[arg(long)]
    repo: PathBuf,
    #[command(flatten)]
    flags: TritonFlags,
}

#[derive(Clone, Copy, ValueEnum)]
enum TritonKindArg {
    /// KIND_CPU instances.
    Cpu,
    /// KIND_GPU instances (ONNX Runtime's CUDA execution provider).
    Gpu,
}

#[derive(Clone, Copy, ValueEnum)]
enum TritonTensorRtArg {
    /// TensorRT in FP16.
    Fp16,
    /// TensorRT in FP32.
    Fp32,
}

/// The `--triton-*` flags shared by `build --triton-repo` and `triton`.
#[derive(Args)]
struct TritonFlags {
    /// Triton model name [default: the preset name, else the model file's stem].
    #[arg(long)]
    triton_name: Option<String>,
    /// Version directory [default: 1].
    #[arg(long)]
    triton_version: Option<u64>,
    /// max_batch_size; 0 turns batching off [default: 8, 1 for with-past models].
    #[arg(long)]
    triton_max_batch_size: Option<u32>,
    /// Where the instances run [default: cpu].
    #[arg(long, value_enum)]
    triton_kind: Option<TritonKindArg>,
    /// Model instances (instance_group count) [default: 1].
    #[arg(long)]
    triton_instances: Option<u32>,
    /// TensorRT execution accelerator for gpu instances.
    #[arg(long, value_enum)]
    triton_tensorrt: Option<TritonTensorRtArg>,
    /// Dynamic batcher max_queue_delay_microseconds [default: 100].
    #[arg(long)]
    triton_max_queue_delay_us: Option<u64>,
}

impl TritonFlags {
    fn any_given(&self) -> Option<&'static str> {
        [
            ("--triton-name", self.triton_name.is_some()),
            ("--triton-version", self.triton_version.is_some()),
            (
                "--triton-max-batch-size",
                self.triton_max_batch_size.is_some(),
            ),
            ("--triton-kind", self.triton_kind.is_some()),
            ("--triton-instances", self.triton_instances.is_some()),
            ("--triton-tensorrt", self.triton_tensorrt.is_some()),
            (
                "--triton-max-queue-delay-us",
                self.triton_max_queue_delay_us.is_some(),
            ),
        ]
        .into_iter()
        .find(|(_, given)| *given)
        .map(|(flag, _)| flag)
    }

    fn options(&self, default_name: &str) -> gmlp_onnx::triton::TritonOptions {
        use gmlp_onnx::triton::{InstanceKind, TensorRtPrecision, TritonOptions};
        let mut o = TritonOptions::new(self.triton_name.as_deref().unwrap_or(default_name));
        o.version = self.triton_version.unwrap_or(o.version);
        o.max_batch_size = self.triton_max_batch_size;
        o.kind = match self.triton_kind {
            Some(TritonKindArg::Gpu) => InstanceKind::Gpu,
            _ => InstanceKind::Cpu,
        };
        o.instance_count = self.triton_instances.unwrap_or(o.instance_count);
        o.tensorrt = self.triton_tensorrt.map(|t| match t {
            TritonTensorRtArg::Fp16 => TensorRtPrecision::Fp16,
            TritonTensorRtArg::Fp32 => TensorRtPrecision::Fp32,
        });
        o.max_queue_delay_us = self
            .triton_max_queue_delay_us
            .unwrap_or(o.max_queue_delay_us);
        o
    }
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn print_repository(w: &gmlp_onnx::triton::RepositoryWritten) {
    println!(
        "wrote Triton model {} (max_batch_size {}{}): {} and {}{}",
        w.config.options.name,
        w.config.max_batch_size,
        if w.config.states.is_empty() {
            String::new()
        } else {
            format!(", {} implicit states", w.config.states.len())
        },
        w.paths.config.display(),
        w.paths.model.display(),
        w.data_file
            .as_ref()
            .map(|d| format!(" + {}", d.display()))
            .unwrap_or_default()
    );
}

fn run_triton(a: TritonArgs) -> anyhow::Result<()> {
    let options = a.flags.options(&file_stem(&a.model));
    let written = gmlp_onnx::triton::write_repository(&a.model, &a.repo, &options)?;
    print_repository(&written);
    Ok(())
}

#[derive(Clone, Copy, ValueEnum)]
enum SpatialArg {
    Dense,
    ToeplitzExpand,
    ToeplitzGather,
}

#[derive(Clone, Copy, ValueEnum)]
enum DtypeArg {
    /// Everything in f32.
    F32,
    /// Weights and MatMuls in f16; LayerNorm, softmax and logits in f32.
    F16,
}

#[derive(Clone, Copy, ValueEnum)]
enum InitArg {
    /// The paper's init: W near zero, b = 1 (identity gating at start).
    Paper,
    /// Every parameter away from its trivial value (for testing exports).
    Spread,
}

#[derive(Clone, Copy, ValueEnum)]
enum FormatArg {
    /// Recognize the layout from tensor names.
    Auto,
    /// This project's own names (see README).
    Native,
    /// timm's gMLP (MlpMixer with SpatialGatingBlock).
    Timm,
    /// g-mlp-pytorch (gMLP, gMLPVision).
    Lucidrains,
}

#[derive(Args)]
struct BuildArgs {
    /// Preset name (see `gmlp-onnx presets`).
    #[arg(long, required_unless_present = "weights", conflicts_with = "weights")]
    preset: Option<String>,
    /// Trained checkpoint (safetensors; F32, F16, BF16): the architecture is read from it.
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Layout of --weights.
    #[arg(long, value_enum, default_value = "auto")]
    weights_format: FormatArg,
    /// Accept checkpoint tensors the model does not use.
    #[arg(long)]
    allow_unused: bool,
    /// Relative tolerance (of max|W|) for accepting a dense W as Toeplitz [default: 1e-5].
    #[arg(long)]
    toeplitz_tol: Option<f32>,
    /// g-mlp-pytorch token shift the checkpoint was trained with (not visible in weights).
    #[arg(long, default_value_t = 0)]
    shift_tokens: usize,
    /// Also write the model's weights in the native layout (safetensors).
    #[arg(long)]
    save_weights: Option<PathBuf>,
    /// Output ONNX file.
    #[arg(short, long)]
    output: PathBuf,
    /// Spatial weight form (default: toeplitz-gather for token presets, dense for vision).
    #[arg(long, value_enum)]
    spatial: Option<SpatialArg>,
    /// ONNX opset (17..=21); `Gelu` is used from 20, the exact erf form below.
    #[arg(long, default_value_t = DEFAULT_OPSET)]
    opset: i64,
    /// Storage and compute type.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DtypeArg,
    /// Seed of the weights (the same seed gives the same weights whatever the spatial form).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Initialization scheme.
    #[arg(long, value_enum, default_value = "paper")]
    init: InitArg,
    /// Number of blocks.
    #[arg(long)]
    layers: Option<usize>,
    /// Channel width d_model.
    #[arg(long)]
    d_model: Option<usize>,
    /// Width d_ffn of the first projection (even; the gate halves it).
    #[arg(long)]
    d_ffn: Option<usize>,
    /// Tiny-attention size (aMLP); 0 removes the attention.
    #[arg(long)]
    attn_dim: Option<usize>,
    /// Tokens n (token models).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Vocabulary size (token models).
    #[arg(long)]
    vocab_size: Option<usize>,
    /// Classes (vision models).
    #[arg(long)]
    num_classes: Option<usize>,
    /// Image side (vision models).
    #[arg(long)]
    image_size: Option<usize>,
    /// Patch side (vision models).
    #[arg(long)]
    patch_size: Option<usize>,
    /// Input channels (vision models).
    #[arg(long)]
    in_chans: Option<usize>,
    /// Causal model: W[i, j] = 0 and attention masked for j > i.
    #[arg(long)]
    causal: bool,
    /// After writing, run the model in tract and ONNX Runtime and compare.
    #[arg(long)]
    validate: bool,
    /// Runtimes for --validate.
    #[arg(long, default_value = "tract,ort-cpu")]
    runtimes: String,
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, else the Python onnxruntime package).
    #[arg(long)]
    ort_lib: Option<PathBuf>,
    /// Write the weights to OUT.onnx.data beside the model even under 2 GiB (always done above).
    #[arg(long)]
    external_data: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Also put the model into this Triton model repository (see `gmlp-onnx triton`).
    #[arg(long)]
    triton_repo: Option<PathBuf>,
    #[command(flatten)]
    triton: TritonFlags,
}

#[derive(Args)]
struct ValidateArgs {
    /// The ONNX model.
    model: PathBuf,
    /// Comma-separated runtimes: tract, ort-cpu, ort-cuda.
    #[arg(long, default_value = "tract,ort-cpu")]
    runtimes: String,
    /// Value of the symbolic `batch` dimension of generated inputs [default: 2].
    #[arg(long)]
    batch: Option<usize>,
    /// Value of another symbolic dimension of generated inputs, as NAME=N (repeatable).
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, usize)>,
    /// Seed of the generated inputs.
    #[arg(long)]
    seed: Option<u64>,
    /// Read the inputs from this .npz (one array per model input, by name) instead of generating them.
    #[arg(long)]
    inputs: Option<PathBuf>,
    /// Also compare every runtime with the reference outputs in this .npz (by output name).
    #[arg(long)]
    expected: Option<PathBuf>,
    /// Write the first runtime's outputs to this .npz (usable as --expected later).
    #[arg(long)]
    save_outputs: Option<PathBuf>,
    /// After one warm-up run, time N runs per runtime and report median and min latency.
    #[arg(long, default_value_t = 0)]
    bench: usize,
    /// Relative tolerance (scaled by the largest reference magnitude).
    #[arg(long)]
    rtol: Option<f64>,
    /// Absolute tolerance.
    #[arg(long)]
    atol: Option<f64>,
    /// Allow TF32 on the CUDA execution provider (loosens the default rtol to 1e-2).
    #[arg(long)]
    tf32: bool,
    /// ort-cuda: refuse the model unless every node can be placed on the CUDA execution provider.
    #[arg(long)]
    cuda_no_cpu_fallback: bool,
    /// Write the comparison as JSON to this file.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, else the Python onnxruntime package).
    #[arg(long)]
    ort_lib: Option<PathBuf>,
}

fn parse_dim(s: &str) -> Result<(String, usize), String> {
    let (k, v) = s.split_once('=').ok_or("expected NAME=N")?;
    let v: usize = v.parse().map_err(|_| format!("'{v}' is not a size"))?;
    if k.is_empty() || v == 0 {
        return Err("expected NAME=N with N >= 1".into());
    }
    Ok((k.to_string(), v))
}

/// Raised when runtimes disagree (exit code 1).
#[derive(Debug, thiserror::Error)]
#[error("runtimes disagree beyond the tolerance")]
struct Disagreement;

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
        cfg.spatial = spatial_form(s);
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
    }
    Ok(())
}

/// Runs [`validate_with_progress`] behind a spinner on stderr (hidden when stderr is not
/// a terminal or with `quiet`).
fn validate_with_spinner(
    model: &Path,
    options: &ValidateOptions,
    quiet: bool,
) -> gmlp_onnx::Result<ValidationReport> {
    let target = if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let spinner = ProgressBar::with_draw_target(None, target);
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("valid template"),
    );
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    let report = validate_with_progress(model, options, &mut |step| {
        spinner.set_message(step.to_string())
    });
    spinner.finish_and_clear();
    report
}

fn progress_bar(len: u64, quiet: bool, what: &str) -> ProgressBar {
    let target = if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

fn spatial_form(s: SpatialArg) -> SpatialForm {
    match s {
        SpatialArg::Dense => SpatialForm::Dense,
        SpatialArg::ToeplitzExpand => SpatialForm::ToeplitzExpand,
        SpatialArg::ToeplitzGather => SpatialForm::ToeplitzGather,
    }
}

/// The configuration, weights and their description for a build from a checkpoint.
fn from_checkpoint(
    path: &Path,
    a: &BuildArgs,
) -> anyhow::Result<(GmlpConfig, Arc<dyn WeightSource>, String)> {
    let architecture_flags = [
        ("--layers", a.layers),
        ("--d-model", a.d_model),
        ("--d-ffn", a.d_ffn),
        ("--attn-dim", a.attn_dim),
        ("--seq-len", a.seq_len),
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
        format: match a.weights_format {
            FormatArg::Auto => None,
            FormatArg::Native => Some(Format::Native),
            FormatArg::Timm => Some(Format::Timm),
            FormatArg::Lucidrains => Some(Format::Lucidrains),
        },
        causal: a.causal,
        shift_tokens: a.shift_tokens,
        in_chans: a.in_chans,
        image_size: a.image_size,
        patch_size: a.patch_size,
        spatial: a.spatial.map(spatial_form),
        allow_unused: a.allow_unused,
        toeplitz_tolerance: toeplitz_tol,
    };
    let import = Import::open(path, &hints)?;
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
    let config = import.config.clone();
    let weights: Arc<dyn WeightSource> = Arc::new(import.weights(&config));
    Ok((config, weights, description))
}

/// Refuses output paths that collide with each other or with the input before anything
/// is read or written (each file is still checked again when it is created).
fn check_output_paths(a: &BuildArgs) -> anyhow::Result<()> {
    let data_file =
        gmlp_onnx::model_io::data_file_name(&a.output).map(|name| a.output.with_file_name(name))?;
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

fn run_build(a: BuildArgs) -> anyhow::Result<()> {
    check_output_paths(&a)?;
    let triton = match &a.triton_repo {
        Some(repo) => {
            let default_name = a.preset.clone().unwrap_or_else(|| file_stem(&a.output));
            let options = a.triton.options(&default_name);
            gmlp_onnx::triton::check_target(repo, &options)?;
            Some((repo.clone(), options))
        }
        None => {
            if let Some(flag) = a.triton.any_given() {
                anyhow::bail!(Error::InvalidArgument(format!(
                    "{flag} applies to --triton-repo"
                )));
            }
            None
        }
    };
    let (cfg, source, description, preset_name): (
        GmlpConfig,
        Arc<dyn WeightSource>,
        String,
        Option<&str>,
    ) = match (&a.preset, &a.weights) {
        (Some(name), _) => {
            if a.shift_tokens > 0 {
                anyhow::bail!(Error::InvalidArgument(
                    "--shift-tokens applies to --weights (g-mlp-pytorch checkpoints)".into()
                ));
            }
            let import_only = [
                ("--toeplitz-tol", a.toeplitz_tol.is_some()),
                ("--allow-unused", a.allow_unused),
                (
                    "--weights-format",
                    !matches!(a.weights_format, FormatArg::Auto),
                ),
            ];
            if let Some((flag, _)) = import_only.iter().find(|(_, given)| *given) {
                anyhow::bail!(Error::InvalidArgument(format!(
                    "{flag} applies to --weights (it describes the checkpoint)"
                )));
            }
            let p = preset(name)?;
            let mut cfg = p.config.clone();
            apply_overrides(&mut cfg, &a, name)?;
            let scheme = match a.init {
                InitArg::Paper => InitScheme::Paper,
                InitArg::Spread => InitScheme::Spread,
            };
            let description = format!(
                "seeded init (scheme {}, seed {})",
                serde_json::to_string(&scheme)?.trim_matches('"'),
                a.seed
            );
            let source: Arc<dyn WeightSource> = Arc::new(SeededInit {
                seed: a.seed,
                scheme,
            });
            (cfg, source, description, Some(p.name))
        }
        (None, Some(path)) => {
            let (cfg, source, description) = from_checkpoint(path, &a)?;
            (cfg, source, description, None)
        }
        (None, None) => anyhow::bail!(Error::InvalidArgument("give --preset or --weights".into())),
    };
    let mut cfg = cfg;
    cfg.dtype = match a.dtype {
        DtypeArg::F32 => Precision::F32,
        DtypeArg::F16 => Precision::F16,
    };
    let model = export(&cfg, source.clone(), &description, preset_name, a.opset)?;
    let c = counts(&model.graph);
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
    let bar = progress_bar(model.graph.initializer_bytes(), a.quiet, "writing weights");
    let layout = if a.external_data {
        ExternalData::Always
    } else {
        ExternalData::Auto
    };
    let written = write_model_with(&model.graph, &model.info, &a.output, layout, |k, _| {
        bar.set_position(done_bytes[k - 1])
    })?;
    let bytes = written.model_bytes;
    let data_note = match &written.data_file {
        Some((path, len)) => format!(
            " + {} ({:.1} MB external data)",
            path.display(),
            *len as f64 / 1e6
        ),
        None => String::new(),
    };
    bar.finish_and_clear();
    if let Some(path) = &a.save_weights {
        if let Err(e) = save_native(path, &cfg, source.as_ref()) {
            // No partial result: the model written just before goes too.
            let _ = std::fs::remove_file(&a.output);
            if let Some((data, _)) = &written.data_file {
                let _ = std::fs::remove_file(data);
            }
            return Err(e.into());
        }
        println!("wrote {} (native layout)", path.display());
    }
    if let Some((repo, options)) = &triton {
        match gmlp_onnx::triton::write_repository(&a.output, repo, options) {
            Ok(w) => print_repository(&w),
            Err(e) => {
                // No partial result: the model (and weights) written just before go too.
                let _ = std::fs::remove_file(&a.output);
                if let Some((data, _)) = &written.data_file {
                    let _ = std::fs::remove_file(data);
                }
                if let Some(path) = &a.save_weights {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e.into());
            }
        }
    }
    println!(
        "wrote {}{data_note} ({:.1} MB): {} stored parameters, {:.2} GFLOPs per example (paper convention), opset {}, spatial {}",
        a.output.display(),
        bytes as f64 / 1e6,
        c.stored_params,
        c.flops as f64 / 1e9,
        a.opset,
        cfg.spatial.as_str()
    );
    if a.validate {
        let mut options = ValidateOptions::new(RuntimeKind::parse_list(&a.runtimes)?);
        options.batch = 1;
        options.runtime.ort_library = a.ort_lib.clone();
        let report = validate_with_spinner(&a.output, &options, a.quiet)?;
        finish_validation(report, None)?;
    }
    Ok(())
}

fn finish_validation(report: ValidationReport, json: Option<&Path>) -> anyhow::Result<()> {
    print!("{}", report.render());
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&report)?;
        gmlp_onnx::model_io::write_atomically(path, |w| {
            use std::io::Write;
            w.write_all(text.as_bytes()).map_err(|e| Error::io(path, e))
        })?;
    }
    if report.pairs.is_empty() {
        println!("only one runtime ran and no --expected file: nothing was compared");
    }
    if report.pass {
        println!("PASS");
        Ok(())
    } else {
        println!("FAIL");
        Err(Disagreement.into())
    }
}

fn run_validate(a: ValidateArgs) -> anyhow::Result<()> {
    let default_rtol = if a.tf32 {
        1e-2
    } else {
        Tolerance::default().rtol
    };
    if a.inputs.is_some() && (a.batch.is_some() || !a.dims.is_empty() || a.seed.is_some()) {
        anyhow::bail!(Error::InvalidArgument(
            "--batch, --dim and --seed shape generated inputs; they cannot be combined with --inputs".into()
        ));
    }
    let options = ValidateOptions {
        runtimes: RuntimeKind::parse_list(&a.runtimes)?,
        batch: a.batch.unwrap_or(2),
        dims: a.dims,
        seed: a.seed.unwrap_or(0),
        inputs: a.inputs,
        expected: a.expected,
        save_outputs: a.save_outputs,
        bench: a.bench,
        tolerance: Tolerance {
            rtol: a.rtol.unwrap_or(default_rtol),
            atol: a.atol.unwrap_or(Tolerance::default().atol),
        },
        runtime: RuntimeOptions {
            ort_library: a.ort_lib,
            cuda_tf32: a.tf32,
            cuda_no_cpu_fallback: a.cuda_no_cpu_fallback,
            ..Default::default()
        },
    };
    for (flag, v) in [
        ("--rtol", options.tolerance.rtol),
        ("--atol", options.tolerance.atol),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            anyhow::bail!(Error::InvalidArgument(format!(
                "{flag} must be a finite number >= 0"
            )));
        }
    }
    let report = validate_with_spinner(&a.model, &options, false)
        .with_context(|| format!("validate {}", a.model.display()))?;
    finish_validation(report, a.report.as_deref())
}

fn run_inspect(model: &Path, json: bool) -> anyhow::Result<()> {
    let summary = gmlp_onnx::inspect::inspect(model)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.render());
    }
    Ok(())
}

fn run_presets(json: bool) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for p in presets() {
        let graph = gmlp_onnx::gmlp::build_graph(
            &p.config,
            Arc::new(SeededInit {
                seed: 0,
                scheme: InitScheme::Paper,
            }),
            DEFAULT_OPSET,
        )?;
        let c = counts(&graph);
        rows.push((p, c));
    }
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(p, c)| {
                serde_json::json!({
                    "name": p.name,
                    "config": p.config,
                    "params": c.stored_params,
                    "flops": c.flops,
                    "flops_with_head": c.flops_with_head,
                    "paper_params_m": p.paper_params_m,
                    "paper_flops_b": p.paper_flops_b,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<12} {:>4} {:>6} {:>6} {:>5} {:>16} {:>10} {:>7} {:>12} {:>10} {:>7}",
        "preset",
        "L",
        "d",
        "f",
        "attn",
        "spatial",
        "params(M)",
        "paper",
        "FLOPs(B)",
        "paper",
        "ΔFLOPs"
    );
    for (p, c) in rows {
        let params_m = c.stored_params as f64 / 1e6;
        let flops_b = c.flops as f64 / 1e9;
        println!(
            "{:<12} {:>4} {:>6} {:>6} {:>5} {:>16} {:>10.2} {:>7.1} {:>12.1} {:>10.1} {:>+6.1}%   (params {:+.2}%)",
            p.name,
            p.config.layers,
            p.config.d_model,
            p.config.d_ffn,
            p.config.attn_dim.map_or("-".to_string(), |a| a.to_string()),
            p.config.spatial.as_str(),
            params_m,
            p.paper_params_m,
            flops_b,
            p.paper_flops_b,
            100.0 * (flops_b / p.paper_flops_b - 1.0),
            100.0 * (params_m / p.paper_params_m - 1.0),
        );
    }
    println!("FLOPs: 2 per multiply-add of every MatMul and Conv for one example, output head excluded (the paper's convention).");
    Ok(())
}

fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<Disagreement>().is_some() {
        return 1;
    }
    match e.downcast_ref::<Error>() {
        Some(Error::RuntimeUnavailable { .. }) => 3,
        _ => 2,
    }
}

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        if gmlp_onnx::error::panic_is_contained() {
            return;
        }
        eprintln!(
            "gmlp-onnx: internal error: {}; this is a bug, please report it with the command line that caused it",
            info.to_string().replace('\n', " ")
        );
    }));
    // Ctrl-C / SIGTERM / SIGHUP: remove the files still being written, then exit 130.
    let _ = ctrlc::set_handler(|| {
        let removed = gmlp_onnx::model_io::abandon_pending_files();
        eprintln!("gmlp-onnx: interrupted; removed {removed} unfinished output file(s)");
        std::process::exit(130);
    });
    // Lets the tests check the panic backstop above from outside (exit 101, one line).
    if std::env::var_os("GMLP_ONNX_DEBUG_PANIC").is_some() {
        panic!("GMLP_ONNX_DEBUG_PANIC is set");
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version: print as clap does, exit 0.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // Usage errors on one line, like every other error, with exit code 2.
            let text = e.to_string();
            let message: Vec<&str> = text
                .lines()
                .map(str::trim)
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .filter(|l| !l.is_empty())
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            eprintln!("gmlp-onnx: error: {message} (see --help)");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Build(a) => run_build(a),
        Command::Presets { json } => run_presets(json),
        Command::Validate(a) => run_validate(a),
        Command::Inspect { model, json } => run_inspect(&model, json),
        Command::Triton(a) => run_triton(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = exit_code(&e);
            if e.downcast_ref::<Disagreement>().is_none() {
                let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
                eprintln!("gmlp-onnx: error: {}", chain.join(": ").replace('\n', " "));
            } else {
                eprintln!("gmlp-onnx: error: {e}");
            }
            ExitCode::from(code)
        }
    }
}
