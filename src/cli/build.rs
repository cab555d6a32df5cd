//! `gmlp-onnx build`: a model from a preset (with overrides) or a trained checkpoint,
//! written atomically, optionally validated.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, ValueEnum};

use gmlp_onnx::checkpoint::{save_native, Format, Import, ImportHints};
use gmlp_onnx::gmlp::export::export_for;
use gmlp_onnx::gmlp::targets::{BuildTarget, Target};
use gmlp_onnx::gmlp::{
    preset, GateAct, GmlpConfig, InitScheme, Precision, SeededInit, SequenceMode, SpatialForm,
    Task, WeightSource,
};
use gmlp_onnx::onnx::writer::{data_file_name, write_model_with, ExternalData};
use gmlp_onnx::runtime::RuntimeKind;
use gmlp_onnx::serve::triton::{check_target, write_repository};
use gmlp_onnx::validate::{ToleranceRequest, ValidateOptions};
use gmlp_onnx::Error;

use crate::cli::progress::{progress_bar, validate_with_spinner};
use crate::cli::triton::{file_stem, print_repository, TritonFlags};
use crate::cli::validate::finish_validation;

#[derive(Clone, Copy, ValueEnum)]
pub enum SpatialArg {
    /// A free n×n W.
    Dense,
    /// Toeplitz W stored expanded to n×n.
    ToeplitzExpand,
    /// Toeplitz W stored as its 2n−1 vector and gathered in the graph.
    ToeplitzGather,
}

/// `--target`: a deployment profile (see [`Target`]).
#[derive(Clone, Copy, Default, ValueEnum)]
pub enum TargetArg {
    /// ONNX Runtime >= 1.15, tract, OpenVINO, onnxruntime-node, onnx.reference, OpenCV 5: opset 17, LayerNormalization.
    #[default]
    Ort,
    /// ONNX Runtime <= 1.14: IR <= 8, opset <= 18.
    OrtLegacy,
    /// Widest reach (ONNX Runtime 1.14, candle-onnx, OpenCV 4.x, onnx2torch): opset 13, LayerNorm as primitive ops, Toeplitz expanded.
    Portable,
    /// OpenCV 4.x dnn: Toeplitz expanded (no Gather feeding a MatMul).
    Opencv4,
    /// candle-onnx: LayerNorm as primitive ops, means as ReduceSum then Div.
    Candle,
}

impl TargetArg {
    fn target(self) -> Target {
        match self {
            TargetArg::Ort => Target::Ort,
            TargetArg::OrtLegacy => Target::OrtLegacy,
            TargetArg::Portable => Target::Portable,
            TargetArg::Opencv4 => Target::Opencv4,
            TargetArg::Candle => Target::Candle,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DtypeArg {
    /// Everything in f32.
    F32,
    /// Weights and MatMuls in f16; LayerNorm, softmax and logits in f32.
    F16,
    /// Projections, spatial MatMul and vocabulary head in int8 (per output channel),
    /// dynamically quantized activations; LayerNorm, softmax, residual and logits in f32.
    Int8,
}

/// The state form of `--with-past` (docs/static-state.md).
#[derive(Clone, Copy, ValueEnum)]
pub enum PastArg {
    /// Fixed-size state [batch, n, ·] written in place, a `position` input [batch]
    /// (batches sequences at different positions).
    Static,
    /// State that grows with every token: past_* [batch, P, ·] in, present_* = past
    /// followed by the new rows out (the default).
    Growing,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum InitArg {
    /// The paper's init: W near zero, b = 1 (identity gating at start).
    Paper,
    /// Every parameter away from its trivial value (for testing exports).
    Spread,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum FormatArg {
    /// Recognize the layout from tensor names.
    Auto,
    /// This project's own names (see docs/checkpoints.md).
    Native,
    /// timm's gMLP (MlpMixer with SpatialGatingBlock).
    Timm,
    /// g-mlp-pytorch (gMLP, gMLPVision).
    Lucidrains,
    /// g-mlp-gpt (gMLPGPT, causal language model).
    GmlpGpt,
    /// gmlp-tinygrad (gMLP backbone: inputs_embeds → last_hidden_state).
    Tinygrad,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum GateActArg {
    /// No activation (upstream's default `nn.Identity()`).
    Identity,
    /// tanh.
    Tanh,
    /// Logistic sigmoid.
    Sigmoid,
    /// max(x, 0).
    Relu,
    /// Exact GELU.
    Gelu,
    /// x·sigmoid(x).
    Silu,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["preset", "weights"])))]
pub struct BuildArgs {
    /// Preset name (see `gmlp-onnx presets`).
    #[arg(long)]
    pub preset: Option<String>,
    /// Trained checkpoint: safetensors (F32, F16, BF16, F64), NumPy .npz (float32, float64) or PyTorch .pt/.pth/.bin from torch.save; the architecture is read from it.
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Layout of --weights.
    #[arg(long, value_enum, default_value = "auto")]
    pub weights_format: FormatArg,
    /// Accept checkpoint tensors the model does not use.
    #[arg(long)]
    pub allow_unused: bool,
    /// Relative tolerance (of max|W|) for accepting a dense W as Toeplitz [default: 1e-5].
    #[arg(long)]
    pub toeplitz_tol: Option<f32>,
    /// g-mlp-pytorch token shift the checkpoint was trained with (not visible in weights).
    #[arg(long, default_value_t = 0)]
    pub shift_tokens: usize,
    /// Gate activation the checkpoint was trained with: g-mlp-pytorch's and g-mlp-gpt's `act` (not visible in weights).
    #[arg(long, value_enum, default_value = "identity")]
    pub gate_act: GateActArg,
    /// Also write the model's weights in the native layout (safetensors).
    #[arg(long)]
    pub save_weights: Option<PathBuf>,
    /// Output ONNX file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Spatial weight form (default: toeplitz-gather for token presets, dense for vision).
    #[arg(long, value_enum)]
    pub spatial: Option<SpatialArg>,
    /// Deployment profile: picks the opset, spatial form and op forms its consumers accept (explicit --opset / --spatial win).
    #[arg(long, value_enum, default_value = "ort")]
    pub target: TargetArg,
    /// ONNX opset (13..=24) [default: 13 for --target portable, else 17]; LayerNormalization from 17 (primitive ops below), `Gelu` from 20 (the exact erf form below).
    #[arg(long)]
    pub opset: Option<i64>,
    /// Storage and compute type.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DtypeArg,
    /// Seed of the weights (the same seed gives the same weights whatever the spatial form).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Initialization scheme.
    #[arg(long, value_enum, default_value = "paper")]
    pub init: InitArg,
    /// Number of blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Channel width d_model.
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Width d_ffn of the first projection (even; the gate halves it).
    #[arg(long)]
    pub d_ffn: Option<usize>,
    /// Tiny-attention size (aMLP); 0 removes the attention.
    #[arg(long)]
    pub attn_dim: Option<usize>,
    /// Tokens n (token models).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Vocabulary size (token models).
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// Classes (vision models).
    #[arg(long)]
    pub num_classes: Option<usize>,
    /// Image side (vision models).
    #[arg(long)]
    pub image_size: Option<usize>,
    /// Patch side (vision models).
    #[arg(long)]
    pub patch_size: Option<usize>,
    /// Input channels (vision models).
    #[arg(long)]
    pub in_chans: Option<usize>,
    /// Causal model: W[i, j] = 0 and attention masked for j > i.
    #[arg(long)]
    pub causal: bool,
    /// Causal token models: keep the static [batch, n] input (default: any length 1..=n;
    /// `--target portable` and `opencv4` keep it static).
    #[arg(long, conflicts_with = "with_past")]
    pub fixed_seq: bool,
    /// Causal token models: one graph for prefill and single steps, with each block's
    /// state as past_* inputs and present_* outputs: `growing` (past_* [batch, P, ·],
    /// present_* one row longer per token; the form loops, Triton and consumers have used
    /// so far) or `static` (fixed size [batch, n, ·], a per-sequence `position` input, new
    /// rows written in place: faster steps, batches of sequences at different positions)
    /// [default: growing]; see docs/generation.md and docs/static-state.md.
    #[arg(long, value_enum, num_args = 0..=1)]
    pub with_past: Option<Option<PastArg>>,
    /// After writing, run the model in tract and ONNX Runtime and compare.
    #[arg(long)]
    pub validate: bool,
    /// Runtimes for --validate.
    #[arg(long, default_value = "tract,ort-cpu")]
    pub runtimes: String,
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, else a Python environment's onnxruntime; see `gmlp-onnx doctor`).
    #[arg(long)]
    pub ort_lib: Option<PathBuf>,
    /// --validate: relative tolerance [default: by precision: f32 1e-4, f16 1e-2].
    #[arg(long, requires = "validate")]
    pub rtol: Option<f64>,
    /// --validate: absolute tolerance [default: by precision: f32 1e-6, f16 1e-4].
    #[arg(long, requires = "validate")]
    pub atol: Option<f64>,
    /// Write the weights to OUT.onnx.data beside the model even under 2 GiB (always done above).
    #[arg(long)]
    pub external_data: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Also put the model into this Triton model repository (see `gmlp-onnx triton`).
    #[arg(long)]
    pub triton_repo: Option<PathBuf>,
    /// The --triton-* options of the repository.
    #[command(flatten)]
    pub triton: TritonFlags,
}

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
        Task::Backbone { seq_len } => set(seq_len, a.seq_len),
    }
    Ok(())
}

fn gate_act(a: GateActArg) -> GateAct {
    match a {
        GateActArg::Identity => GateAct::Identity,
        GateActArg::Tanh => GateAct::Tanh,
        GateActArg::Sigmoid => GateAct::Sigmoid,
        GateActArg::Relu => GateAct::Relu,
        GateActArg::Gelu => GateAct::Gelu,
        GateActArg::Silu => GateAct::Silu,
    }
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
            FormatArg::GmlpGpt => Some(Format::GmlpGpt),
            FormatArg::Tinygrad => Some(Format::Tinygrad),
        },
        causal: a.causal,
        shift_tokens: a.shift_tokens,
        in_chans: a.in_chans,
        image_size: a.image_size,
        patch_size: a.patch_size,
        spatial: a.spatial.map(spatial_form),
        allow_unused: a.allow_unused,
        seq_len: a.seq_len,
        gate_act: gate_act(a.gate_act),
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
        config.spatial = a.target.target().spatial_for(config.spatial);
    }
    let weights: Arc<dyn WeightSource> = Arc::new(import.weights(&config));
    Ok((config, weights, description))
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

/// Runs `build`.
pub fn run(a: BuildArgs) -> anyhow::Result<()> {
    check_output_paths(&a)?;
    let triton = match &a.triton_repo {
        Some(repo) => {
            let default_name = a.preset.clone().unwrap_or_else(|| file_stem(&a.output));
            let options = a.triton.options(&default_name);
            check_target(repo, &options)?;
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
    let target = BuildTarget::resolve(a.target.target(), a.opset)?;
    let tolerance = ToleranceRequest {
        rtol: a.rtol,
        atol: a.atol,
    }
    .check()?;
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
            cfg.spatial = target.target.spatial_for(cfg.spatial);
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
        DtypeArg::Int8 => Precision::Int8,
    };
    target.check(cfg.spatial)?;
    let mode = match a.with_past {
        Some(Some(PastArg::Static)) => SequenceMode::Static,
        Some(Some(PastArg::Growing)) => SequenceMode::WithPast,
        Some(None) => SequenceMode::WithPast,
        None if a.fixed_seq => SequenceMode::Fixed,
        None => target.target.sequence_for(&cfg),
    };
    mode.check(&cfg)?;
    let model = export_for(
        &cfg,
        source.clone(),
        &description,
        preset_name,
        &target,
        mode,
    )?;
    let c = model.counts.clone();
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
            " + {} ({:.1} MB of external data)",
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
        match write_repository(&a.output, repo, options) {
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
        "wrote {} ({:.1} MB){data_note}: {} stored parameters, {} per example (paper convention), target {}, opset {}, spatial {}",
        a.output.display(),
        bytes as f64 / 1e6,
        c.stored_params,
        gmlp_onnx::inspect::human_flops(c.flops),
        target.target.name(),
        target.opset,
        cfg.spatial.as_str()
    );
    if a.validate {
        let mut options = ValidateOptions::new(RuntimeKind::parse_list(&a.runtimes)?);
        options.batch = 1;
        options.runtime.ort_library = a.ort_lib.clone();
        options.tolerance = tolerance;
        let report = validate_with_spinner(&a.output, &options, a.quiet)?;
        finish_validation(report, None, None)?;
    }
    Ok(())
}
