//! From a configuration to a complete ONNX model description: size checks up front,
//! graph emission, metadata, and the counts reported to users.

use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, SpatialForm};
use crate::gmlp::emit::NBITS_ACCURACY_LEVEL;
use crate::gmlp::emit::{build_graph_in, HEAD_SCOPE};
use crate::gmlp::interface::{DecodingInfo, SequenceMode};
use crate::gmlp::metadata::{
    config_json, quantization_json, CONFIG_KEY, DECODING_KEY, FLOPS_KEY, PRESET_KEY,
    QUANTIZATION_KEY, STORED_PARAMS_KEY, TARGET_KEY, VERSION_KEY, WEIGHTS_KEY,
};
use crate::gmlp::targets::BuildTarget;
use crate::gmlp::weights::WeightSource;
use crate::onnx::graph::Graph;
use crate::onnx::writer::{ModelInfo, PROTOBUF_LIMIT};

/// Default opset (first with `LayerNormalization`).
pub const DEFAULT_OPSET: i64 = 17;
/// The tool's name and version, written as `producer_name` / `producer_version`.
pub const TOOL: &str = env!("CARGO_PKG_NAME");
/// The tool's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A model ready to be written.
pub struct Export {
    /// The graph, with lazily produced weights.
    pub graph: Graph,
    /// Model-level fields and metadata.
    pub info: ModelInfo,
    /// Parameter and FLOP counts as the metadata records them (for variable-length and
    /// with-past models, those of the same model at the full length n).
    pub counts: GraphCounts,
}

/// Counts of an emitted graph.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GraphCounts {
    /// f32 values stored as initializers (parameters as stored; a Toeplitz W expanded to
    /// n×n counts n² here).
    pub stored_params: u64,
    /// MatMul and Conv FLOPs (2 per multiply-add) per example outside the output head:
    /// the convention of the paper's FLOP columns.
    pub flops: u64,
    /// The same including the output head (for token models, the vocabulary projection).
    pub flops_with_head: u64,
}

/// Counts read from `graph` (no weight is produced).
pub fn counts(graph: &Graph) -> GraphCounts {
    let head = format!("{HEAD_SCOPE}/");
    GraphCounts {
        stored_params: graph.stored_f32_count(),
        flops: graph.flops_where(|name| !name.starts_with(&head)),
        flops_with_head: graph.flops_where(|_| true),
    }
}

/// Largest model accepted, in bytes of f32 weights (refused up front, before any
/// allocation, with the estimate).
pub const MAX_MODEL_BYTES: u128 = 64 << 30;

/// Refuses configurations that are too large, estimated from the sizes alone before
/// anything is allocated: weights over [`MAX_MODEL_BYTES`], or constants that must stay
/// inline in the graph (Toeplitz index table, causal mask) over the 2 GiB protobuf limit.
/// Weights over 2 GiB are fine: they go to external data.
pub fn check_size(cfg: &GmlpConfig) -> Result<()> {
    cfg.validate()?;
    let n = cfg.seq_len() as u128;
    let weights = cfg.stored_f32_estimate() * cfg.dtype.elem().size() as u128;
    let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
    if weights > MAX_MODEL_BYTES {
        return Err(Error::TooLarge(format!(
            "the model would hold {:.1} GiB of weights ({:.0}M parameters), over the {:.0} GiB limit",
            gib(weights),
            cfg.stored_f32_estimate() as f64 / 1e6,
            gib(MAX_MODEL_BYTES)
        )));
    }
    let mut inline = 0u128;
    if cfg.spatial == SpatialForm::ToeplitzGather {
        inline += n * n * 8;
    }
    if cfg.causal && cfg.attn_dim.is_some() {
        inline += n * n * 4;
    }
    if inline > u128::from(PROTOBUF_LIMIT) / 2 {
        return Err(Error::TooLarge(format!(
            "{n} tokens need {:.2} GiB of constants inside the graph (index table, mask), over the 1 GiB allowed in the 2 GiB protobuf; use fewer tokens",
            gib(inline)
        )));
    }
    Ok(())
}

/// Emits `cfg` with weights from `source` and attaches the metadata: the configuration
/// as JSON, the tool version, where the weights came from, and the preset name if any.
/// The sequence axis is [`SequenceMode::default_for`] the model (variable for causal token
/// models).
pub fn export(
    cfg: &GmlpConfig,
    source: Arc<dyn WeightSource>,
    weights_description: &str,
    preset: Option<&str>,
    opset: i64,
) -> Result<Export> {
    export_for(
        cfg,
        source,
        weights_description,
        preset,
        &BuildTarget::at_opset(opset),
        SequenceMode::default_for(cfg),
    )
}

/// [`export`] for a `--target` profile (its opset and op forms, and its name in the
/// metadata `gmlp_onnx.target`) with the sequence axis emitted as `mode` says;
/// variable-length and with-past models also record [`DecodingInfo`] under
/// [`DECODING_KEY`], and their counts are those of the same model at the full length n.
/// The spatial form is the configuration's (the caller applies the profile's with
/// [`crate::gmlp::targets::Target::spatial_for`]).
pub fn export_for(
    cfg: &GmlpConfig,
    source: Arc<dyn WeightSource>,
    weights_description: &str,
    preset: Option<&str>,
    target: &BuildTarget,
    mode: SequenceMode,
) -> Result<Export> {
    check_size(cfg)?;
    let graph = build_graph_in(cfg, source.clone(), target, mode)?;
    let c = if mode == SequenceMode::Fixed {
        counts(&graph)
    } else {
        counts(&build_graph_in(cfg, source, target, SequenceMode::Fixed)?)
    };
    let mut metadata = vec![
        (CONFIG_KEY.to_string(), config_json(cfg)?),
        (VERSION_KEY.to_string(), format!("{TOOL} {VERSION}")),
        (WEIGHTS_KEY.to_string(), weights_description.to_string()),
        (STORED_PARAMS_KEY.to_string(), c.stored_params.to_string()),
        (FLOPS_KEY.to_string(), c.flops.to_string()),
    ];
    if let Some(p) = preset {
        metadata.push((PRESET_KEY.to_string(), p.to_string()));
    }
    metadata.push((TARGET_KEY.to_string(), target.target.name()));
    if let Some(mut info) = DecodingInfo::of(cfg, mode) {
        if mode == SequenceMode::Static {
            info.state_start = target.target.state_start();
        }
        metadata.push((DECODING_KEY.to_string(), info.to_json()?));
    }
    if let Some(q) = quantization_json(cfg, &graph, NBITS_ACCURACY_LEVEL)? {
        metadata.push((QUANTIZATION_KEY.to_string(), q));
    }
    let kind = if cfg.attn_dim.is_some() {
        "aMLP"
    } else {
        "gMLP"
    };
    Ok(Export {
        graph,
        info: ModelInfo {
            producer_name: TOOL.to_string(),
            producer_version: VERSION.to_string(),
            doc_string: format!(
                "{kind} (Pay Attention to MLPs, Liu et al. 2021): {} blocks, d_model {}, d_ffn {}, {} tokens, spatial {}{}",
                cfg.layers,
                cfg.d_model,
                cfg.d_ffn,
                cfg.seq_len(),
                cfg.spatial.name(),
                if cfg.causal {
                    mode.causal_description()
                } else {
                    ""
                }
            ),
            metadata,
        },
        counts: c,
    })
}
