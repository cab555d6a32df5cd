//! What a built model says about itself in ONNX `metadata_props` (and a native safetensors
//! file in its `__metadata__`): the keys, and the configuration as JSON. Plain strings here;
//! the ONNX writer and reader carry them.

use serde_json::json;

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Precision};
use crate::gmlp::emit::HEAD_BLOCK_SIZE;
use crate::onnx::graph::Graph;
use crate::onnx::nbits::BLOCK_SIZE;

/// The full [`GmlpConfig`] as JSON (ONNX metadata and native safetensors metadata).
pub const CONFIG_KEY: &str = "gmlp_onnx.config";
/// The tool's name and version.
pub const VERSION_KEY: &str = "gmlp_onnx.version";
/// Where the weights came from (seeded init, or the imported file and layout).
pub const WEIGHTS_KEY: &str = "gmlp_onnx.weights";
/// Number of values stored as initializers.
pub const STORED_PARAMS_KEY: &str = "gmlp_onnx.stored_params";
/// MatMul and Conv FLOPs per example, output head excluded (the paper's convention).
pub const FLOPS_KEY: &str = "gmlp_onnx.flops_per_example";
/// The preset the model was built from, if any.
pub const PRESET_KEY: &str = "gmlp_onnx.preset";
/// The `--target` profile the model was built for (`ort`, `portable`, ...; see
/// [`crate::gmlp::targets`]).
pub const TARGET_KEY: &str = "gmlp_onnx.target";

/// How a causal token model's sequence axis was emitted (variable length, or with the
/// per-block state): [`crate::gmlp::interface::DecodingInfo`] as JSON with n, the state names
/// and widths and the state bytes per token per block; absent for fixed-length models.
pub const DECODING_KEY: &str = "gmlp_onnx.decoding";

/// The token that ends a sequence, when the model has one (`build --eos-token-id`): the
/// id as decimal text. `generate` stops a sequence there, and a genai folder declares it.
pub const END_TOKEN_KEY: &str = "gmlp_onnx.end_token";

/// How a weight-quantized model's weights are stored (`--dtype int4`,
/// `int8-weight-only`): per group of
/// parameters the operator, bits, block size and scale rule, and what stays float; see
/// [`quantization_json`].
pub const QUANTIZATION_KEY: &str = "gmlp_onnx.quantization";

/// The configuration as the JSON stored under [`CONFIG_KEY`].
pub fn config_json(config: &GmlpConfig) -> Result<String> {
    serde_json::to_string(config).map_err(|e| Error::InvalidConfig(format!("config to JSON: {e}")))
}

/// The configuration stored under [`CONFIG_KEY`], if `json` is one.
pub fn parse_config(json: &str) -> Option<GmlpConfig> {
    serde_json::from_str(json).ok()
}

/// The parameters whose quantized forms `graph` stores under names ending in `suffix`
/// (`.int4`, `.int8`), less the `.cols{a}_{b}` / `.transposed` suffixes, with the block
/// index written `*` (`blocks.*.proj_in.weight`), each once, in file order.
pub fn quantized_parameters(graph: &Graph, suffix: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for init in &graph.initializers {
        let Some(base) = init.name.strip_suffix(suffix) else {
            continue;
        };
        let base = base.strip_suffix(".transposed").unwrap_or(base);
        let base = match base.rsplit_once(".cols") {
            Some((b, range)) if range.split('_').all(|p| p.parse::<usize>().is_ok()) => b,
            _ => base,
        };
        let name = match base.split_once('.') {
            Some(("blocks", rest)) => match rest.split_once('.') {
                Some((i, tail)) if i.parse::<usize>().is_ok() => format!("blocks.*.{tail}"),
                _ => base.to_string(),
            },
            _ => base.to_string(),
        };
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// A group of block-quantized weights as the metadata describes it.
fn block_group(
    (bits, block_size): (usize, usize),
    accuracy_level: i64,
    parameters: Vec<String>,
) -> serde_json::Value {
    json!({
        "op": "com.microsoft.MatMulNBits",
        "bits": bits,
        "block_size": block_size,
        "block_axis": "K (input features)",
        "scales": format!(
            "f32 [N, K/{block_size}], rounded to f16: per block, whichever of Q4_0's m/-{} (m: the block's largest-magnitude value) and six least-squares refits of nearby grids leaves the least squared error",
            1 << (bits - 1)
        ),
        "zero_points": format!("none (the default {}: symmetric)", 1 << (bits - 1)),
        "accuracy_level": accuracy_level,
        "parameters": parameters,
    })
}

/// Whether a parameter is a token model's vocabulary projection (tied or its own).
fn is_head(parameter: &str) -> bool {
    matches!(parameter, "embed.weight" | "head.weight")
}

/// What a weight-quantized model records about its weights (metadata
/// `gmlp_onnx.quantization`): for `--dtype int4` and `int8-weight-only`, the block-quantized
/// projections (operator, bits, block, scale rule, `accuracy_level`, parameters), int4's
/// 8-bit output projections (`null` otherwise), a token model's vocabulary head (`null` for
/// vision models and backbones) and what stays float.
/// `None` for other precisions (int8 files carry their form in the config).
pub fn quantization_json(
    cfg: &GmlpConfig,
    graph: &Graph,
    accuracy_level: i64,
) -> Result<Option<String>> {
    let bits = match cfg.dtype {
        Precision::Int4 => 4,
        Precision::Int8WeightOnly => 8,
        Precision::F32 | Precision::F16 | Precision::Int8 => return Ok(None),
    };
    let (head, rest): (Vec<String>, Vec<String>) = quantized_parameters(graph, ".int8")
        .into_iter()
        .partition(|p| is_head(p));
    // int4 files keep the blocks' output projections in 8 bits (the rest of the `.int8`
    // parameters); int8-weight-only files have every projection there.
    let (projected, output) = match bits {
        4 => (quantized_parameters(graph, ".int4"), rest),
        _ => (rest, Vec::new()),
    };
    let projections = block_group((bits, BLOCK_SIZE), accuracy_level, projected);
    let output_projections = if output.is_empty() {
        serde_json::Value::Null
    } else {
        block_group((8, HEAD_BLOCK_SIZE), accuracy_level, output)
    };
    // A vision model's classifier stays f32: no quantized head to describe.
    let head = if head.is_empty() {
        serde_json::Value::Null
    } else {
        block_group((8, HEAD_BLOCK_SIZE), accuracy_level, head)
    };
    let value = json!({
        "dtype": cfg.dtype.name(),
        "projections": projections,
        "output_projections": output_projections,
        "head": head,
        "float": "embedding gather, spatial projection, norms, biases, attention scores and softmax, activations, logits",
    });
    serde_json::to_string(&value)
        .map(Some)
        .map_err(|e| Error::Internal(format!("quantization metadata: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_parameter_names_collapse_slices_and_block_indices() {
        use crate::onnx::builder::GraphBuilder;
        use crate::onnx::graph::{ElemType, TensorData};
        let mut g = GraphBuilder::new(17).unwrap();
        for name in [
            "blocks.0.proj_in.weight.cols0_8.int4",
            "blocks.0.proj_in.weight.cols8_16.int4",
            "blocks.1.proj_in.weight.cols0_8.int4",
            "blocks.1.attn.out.weight.int4",
            "embed.weight.transposed.int8",
            "blocks.1.attn.out.weight.scale",
        ] {
            g.weight_as(name, &[1], ElemType::U8, TensorData::F32(vec![0.0]))
                .unwrap();
        }
        let graph = g.finish("g", vec![]);
        assert_eq!(
            quantized_parameters(&graph, ".int4"),
            vec!["blocks.*.proj_in.weight", "blocks.*.attn.out.weight"]
        );
        assert_eq!(quantized_parameters(&graph, ".int8"), vec!["embed.weight"]);
    }
}
