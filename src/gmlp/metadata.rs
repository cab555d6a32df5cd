//! What a built model says about itself in ONNX `metadata_props` (and a native safetensors
//! file in its `__metadata__`): the keys, and the configuration as JSON. Plain strings here;
//! the ONNX writer and reader carry them.

use crate::error::{Error, Result};
use crate::gmlp::config::GmlpConfig;

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
/// per-block state): [`crate::gmlp::decoding::DecodingInfo`] as JSON with n, the state names
/// and widths and the state bytes per token per block; absent for fixed-length models.
pub const DECODING_KEY: &str = "gmlp_onnx.decoding";

/// How a weight-quantized model's weights are stored (`--dtype int4`): per group of
/// parameters the operator, bits, block size and scale rule, and what stays float; see
/// [`crate::gmlp::quantize::quantization_json`].
pub const QUANTIZATION_KEY: &str = "gmlp_onnx.quantization";

/// The configuration as the JSON stored under [`CONFIG_KEY`].
pub fn config_json(config: &GmlpConfig) -> Result<String> {
    serde_json::to_string(config).map_err(|e| Error::InvalidConfig(format!("config to JSON: {e}")))
}

/// The configuration stored under [`CONFIG_KEY`], if `json` is one.
pub fn parse_config(json: &str) -> Option<GmlpConfig> {
    serde_json::from_str(json).ok()
}
