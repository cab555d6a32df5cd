//! The text form of [`ModelSummary`] (what `gmlp-onnx inspect` prints without `--json`):
//! inputs and outputs, opsets, parameters, operators, metadata, the with-past state and
//! quantization lines.

use super::spatial_weights::spatial_lines;
use super::*;
use crate::gmlp::interface::{DecodingInfo, SequenceMode, StateStart, StateTensor};
use crate::gmlp::metadata::{CONFIG_KEY, QUANTIZATION_KEY};

/// A declared shape as `[batch, 16]`.
fn shape_text(shape: &[serde_json::Value]) -> String {
    let dims: Vec<String> = shape
        .iter()
        .map(|d| match d {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    format!("[{}]", dims.join(", "))
}

/// A FLOP count with a unit that shows its digits: `15.03 GFLOPs`, `1.98 MFLOPs`,
/// `1.08 TFLOPs`, `950 FLOPs`.
pub fn human_flops(flops: u64) -> String {
    let f = flops as f64;
    match flops {
        0..=999_999 => format!("{flops} FLOPs"),
        1_000_000..=999_999_999 => format!("{:.2} MFLOPs", f / 1e6),
        1_000_000_000..=999_999_999_999 => format!("{:.2} GFLOPs", f / 1e9),
        _ => format!("{:.2} TFLOPs", f / 1e12),
    }
}

impl ModelSummary {
    /// Human-readable summary.
    pub fn render(&self) -> String {
        let mut s = self.interface_lines();
        s += &self.size_lines();
        s += &self.model_lines();
        s += &self.trailing_lines();
        s
    }

    /// The file and its interface: model, ir_version and opsets, producer, target, inputs
    /// and outputs.
    fn interface_lines(&self) -> String {
        let mut s = format!("model       {}\n", self.model.display());
        let opsets: Vec<String> = self
            .opsets
            .iter()
            .map(|o| {
                let domain = if o.domain.is_empty() {
                    "ai.onnx"
                } else {
                    &o.domain
                };
                format!("{domain} {}", o.version)
            })
            .collect();
        s += &format!(
            "ir_version  {}\nopsets      {}\n",
            self.ir_version,
            opsets.join(", ")
        );
        if !self.producer.is_empty() {
            s += &format!("producer    {}\n", self.producer);
        }
        if let Some(t) = &self.target {
            s += &format!("target      {t}\n");
        }
        for i in &self.inputs {
            s += &format!(
                "input       {} {} {}\n",
                i.name,
                i.dtype,
                shape_text(&i.shape)
            );
        }
        for o in &self.outputs {
            s += &format!(
                "output      {} {} {}\n",
                o.name,
                o.dtype,
                shape_text(&o.shape)
            );
        }
        s
    }

    /// The sizes: parameters, stored values of a quantized model, FLOPs and nodes.
    fn size_lines(&self) -> String {
        let mut s = String::new();
        s += &format!(
            "parameters  {} ({:.2}M) in {} initializers, {} bytes ({:.1} MB); all initializers {} bytes\n",
            self.parameters,
            self.parameters as f64 / 1e6,
            self.initializers,
            self.parameter_bytes,
            self.parameter_bytes as f64 / 1e6,
            self.initializer_bytes
        );
        if self.quantized_values + self.quantized_copy_values + self.quantization_scale_values > 0 {
            let copies = if self.quantized_copies_of.is_empty() {
                String::new()
            } else {
                format!(
                    ", {} values of quantized copies of {}",
                    self.quantized_copy_values,
                    self.quantized_copies_of.join(", ")
                )
            };
            s += &format!(
                "stored      {} values: {} quantized weight values{copies}, {} quantization scales and zero points\n",
                self.stored_values,
                self.quantized_values,
                self.quantization_scale_values
            );
        }
        if let Some(f) = self.flops_per_example {
            s += &format!("flops       {f} per example ({})\n", human_flops(f));
        }
        let ops: Vec<String> = self.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        s += &format!("nodes       {}: {}\n", self.nodes, ops.join(", "));
        s
    }

    /// What the model is: its configuration and spatial weights, its decoding state and its
    /// quantization.
    fn model_lines(&self) -> String {
        let mut s = String::new();
        if let Some(c) = &self.config {
            s += &format!("config      {c}\n");
            s += &spatial_lines(&self.spatial);
            if let Some(why) = &self.spatial_unavailable {
                s += &format!("spatial     unavailable: {why}\n");
            }
        }
        if let Some(d) = &self.decoding {
            if d.mode == SequenceMode::Static {
                s += &static_state_lines(d);
            } else {
                s += &format!(
                    "sequence    {}, up to {} positions (past_sequence + sequence)\n",
                    d.mode.as_str(),
                    d.max_sequence
                );
                if !d.state.is_empty() {
                    s += &state_lines(d);
                }
            }
        }
        if let Some(q) = &self.quantization {
            s += &quantization_line(q);
        }
        s
    }

    /// The metadata not parsed above, the external data files and the pictures written.
    fn trailing_lines(&self) -> String {
        let mut s = String::new();
        for (key, value) in &self.metadata {
            // The configuration and the quantization are the lines above, parsed.
            let parsed = (key == CONFIG_KEY && self.config.is_some())
                || (key == QUANTIZATION_KEY && self.quantization.is_some());
            if !parsed {
                s += &format!("metadata    {key} = {}\n", value.replace('\n', " "));
            }
        }
        for e in &self.external_data {
            s += &format!(
                "external    {} ({} tensors){}\n",
                e.location,
                e.tensors,
                if e.exists { "" } else { " MISSING" }
            );
        }
        for p in &self.plots {
            s += &format!(
                "picture     {} ({} x {})\n",
                p.file.display(),
                p.width,
                p.height
            );
        }
        s
    }
}

/// The `sequence` and `state` lines of a static-state model (docs/static-state.md): every
/// state tensor keeps n rows, so its size per sequence is fixed.
pub(super) fn static_state_lines(d: &DecodingInfo) -> String {
    let n = d.max_sequence;
    let blocks = d.state.iter().map(|t| t.block + 1).max().unwrap_or(0);
    let per_sequence: usize = d.state.iter().map(|t| n * t.width * 4).sum();
    let first: Vec<String> = d
        .state
        .iter()
        .filter(|t| t.block == 0)
        .map(|t| format!("{} [batch, {n}, {}]", t.past, t.width))
        .collect();
    let start = match d.state_start {
        StateStart::Any => "",
        StateStart::Zeroed => {
            "; buffers must start zeroed (docs/static-state.md, \"Buffers that must start zeroed\")"
        }
    };
    format!(
        "sequence    static, up to {n} positions (position + sequence), one position per sequence\n\
         state       per block: {}; fixed size, written in place: {} bytes per sequence for all {blocks} blocks (f32){start}\n",
        first.join(", "),
        per_sequence
    )
}

/// The `quantized` line: each group of quantized parameters with its bits, operator and
/// block, from the metadata `gmlp_onnx.quantization`.
pub(super) fn quantization_line(q: &serde_json::Value) -> String {
    let groups: Vec<String> = ["projections", "output_projections", "head"]
        .into_iter()
        .filter_map(|group| {
            let g = q.get(group)?;
            let params: Vec<&str> = g
                .get("parameters")?
                .as_array()?
                .iter()
                .filter_map(|p| p.as_str())
                .collect();
            let block = g
                .get("block_size")
                .and_then(|b| b.as_u64())
                .map_or(String::new(), |b| format!(", blocks of {b} along K"));
            let level = g
                .get("accuracy_level")
                .and_then(|l| l.as_i64())
                .map_or(String::new(), |l| format!(", accuracy_level {l}"));
            Some(format!(
                "{} {}-bit ({}{block}{level}): {}",
                group.replace('_', " "),
                g.get("bits")?.as_u64()?,
                g.get("op")?.as_str()?,
                params.join(", ")
            ))
        })
        .collect();
    format!("quantized   {}\n", groups.join("; "))
}

/// The `state` line(s) of the report: one line for models whose blocks all carry the same
/// state (the paper's), one line per block otherwise (local windows and folds).
pub(super) fn state_lines(d: &DecodingInfo) -> String {
    let blocks = d.state.iter().map(|t| t.block + 1).max().unwrap_or(0);
    let describe = |t: &StateTensor| match t.window {
        Some(w) => format!("{} [batch, min(past_sequence, {w}), {}]", t.past, t.width),
        None => format!("{} [batch, past_sequence, {}]", t.past, t.width),
    };
    let shape_of = |b: usize| -> Vec<(String, usize, Option<usize>)> {
        d.state
            .iter()
            .filter(|t| t.block == b)
            .map(|t| (t.kind().to_string(), t.width, t.window))
            .collect()
    };
    let same = (1..blocks).all(|b| shape_of(b) == shape_of(0));
    let windows = |b: usize| -> Vec<&str> {
        let mut kinds: Vec<&str> = d
            .state
            .iter()
            .filter(|t| t.block == b && t.window.is_some())
            .map(|t| {
                if t.kind() == "shift" {
                    "token-shift"
                } else {
                    "local"
                }
            })
            .collect();
        kinds.dedup();
        kinds
    };
    let mut s = String::new();
    if same {
        let per_block: Vec<String> = d
            .state
            .iter()
            .filter(|t| t.block == 0)
            .map(describe)
            .collect();
        s += &format!(
            "state       per block: {}; {} bytes per token per block (f32), {} bytes per token for all {blocks} blocks",
            per_block.join(", "),
            d.state_bytes_per_token_per_block,
            d.state_bytes_per_token_per_block * blocks
        );
        if d.window_bytes_per_block > 0 {
            s += &format!(
                ", plus the {} window: {} bytes per block once full",
                windows(0).join(" and "),
                d.window_bytes_per_block
            );
        }
        s += "\n";
        return s;
    }
    for b in 0..blocks {
        let parts: Vec<String> = d
            .state
            .iter()
            .filter(|t| t.block == b)
            .map(describe)
            .collect();
        s += &format!("state       block {b}: {}\n", parts.join(", "));
    }
    s += &format!(
        "state       at most {} bytes per token per block (f32) that grow, and {} bytes of windows per block once full\n",
        d.state_bytes_per_token_per_block, d.window_bytes_per_block
    );
    s
}
