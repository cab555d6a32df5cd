//! Emits the gMLP / aMLP network as a [`Graph`] (no protobuf here: only graph-builder
//! calls), composed of parts, one file each:
//! ```text
//! context.rs    the emitter: graph builder, parameters by name, shared constants, the
//!               op spelling (standard, or ONNX Runtime's fused kernels)
//! sequence.rs   variable length and with-past state (positions P..P+T−1, past ‖ new)
//! static_state/  fixed-size state written in place (per-sequence positions, scatter;
//!               genai.rs: onnxruntime-genai's interface to it)
//! linear.rs     x·W + b in f32/f16, as a dynamically quantized int8 MatMul, or as a
//!               block-quantized MatMulNBits (int4)
//! embed.rs      input_ids → embedding table, pixel_values → patch stem, or inputs_embeds
//! block/        one block: norm, token shift, channel projections, tiny attention,
//!               spatial projection, gate (see block/mod.rs)
//! stack.rs      x ← x + block_i(x) for every block, or a reversible stack
//! head.rs       final norm and head: logits (tied or own vocabulary projection, or
//!               mean over tokens + classifier); a backbone returns the last block's x
//! ```
//!
//! The f32 graph is shaped for ONNX Runtime's CPU fusions (measured in BENCHMARKS.md):
//! U's two halves are two MatMuls (no `Split` of z), each bias `Add` directly follows its
//! MatMul, and GELU is spelled in the pattern `GeluFusion` and `BiasGeluFusion` match.
//!
//! Causal token models may be emitted with a variable length or with state
//! ([`SequenceMode`]; docs/generation.md): see `sequence`.

mod block;
mod context;
mod embed;
mod head;
mod linear;
mod sequence;
mod stack;
mod static_state;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Task};
use crate::gmlp::emit::static_state::GenaiInterface;
use crate::gmlp::genai::genai_layers;
use crate::gmlp::interface::{
    mode_state, Interface, SequenceMode, NEXT_INPUT_IDS, NEXT_POSITION, TRITON_NEXT_POSITION,
};
use crate::gmlp::targets::BuildTarget;
use crate::gmlp::weights::{param_specs, WeightSource};
use crate::onnx::builder::GraphBuilder;
use crate::onnx::forms::OpForms;
use crate::onnx::graph::{ElemType, Graph, Value};
pub use context::fused_gap;
use context::{Emitter, Spelling};
pub use linear::{HEAD_BLOCK_SIZE, NBITS_ACCURACY_LEVEL};
pub use static_state::StateScatter;

/// Name of the token-model input.
pub const INPUT_IDS: &str = "input_ids";
/// Name of the vision-model input.
pub const PIXEL_VALUES: &str = "pixel_values";
/// Name of the backbone input (embedded tokens, gmlp-tinygrad).
pub const INPUTS_EMBEDS: &str = "inputs_embeds";
/// Name of the output of token and vision models.
pub const LOGITS: &str = "logits";
/// Name of the backbone output.
pub const LAST_HIDDEN_STATE: &str = "last_hidden_state";
/// Name of the symbolic batch dimension.
pub const BATCH: &str = "batch";
/// Node-name scope of the output head; the paper's FLOP counts leave it out.
pub const HEAD_SCOPE: &str = "head";
/// Value added to masked attention scores in causal models.
pub const MASK_VALUE: f32 = -1e9;

/// Whether `cfg`, emitted in `mode` at `opset` with `forms`, is spelled in ONNX Runtime's
/// fused kernels: for `--target onnxruntime`'s forms, where they express the whole model
/// ([`fused_gap`]; other models are refused for that target); never for other forms.
pub fn fused_kernels_apply(
    cfg: &GmlpConfig,
    mode: SequenceMode,
    opset: i64,
    forms: OpForms,
) -> bool {
    matches!(
        Spelling::of(cfg, mode, opset, forms),
        Ok(Spelling::Fused(_))
    )
}

/// Emits the whole network for `cfg` at `opset`, with parameter values taken from
/// `source` when the graph is written, with a fixed sequence length.
pub fn build_graph(cfg: &GmlpConfig, source: Arc<dyn WeightSource>, opset: i64) -> Result<Graph> {
    build_graph_in(
        cfg,
        source,
        &BuildTarget::at_opset(opset),
        SequenceMode::Fixed,
    )
}

/// [`build_graph`] for a `--target` profile (its opset, the op forms it spells the
/// operations in, what its static state's buffers start with) with the sequence axis
/// emitted as `mode` says (fixed, variable length, or variable length with the per-block
/// state in and out).
pub fn build_graph_in(
    cfg: &GmlpConfig,
    source: Arc<dyn WeightSource>,
    target: &BuildTarget,
    mode: SequenceMode,
) -> Result<Graph> {
    build_graph_for(cfg, source, target, mode, Interface::File)
}

/// [`build_graph_in`] with the interface `interface` offers (for [`Interface::BoundStep`]:
/// the greedy tokens and the next positions after the file's outputs; Triton's and genai's
/// state interfaces).
pub fn build_graph_for(
    cfg: &GmlpConfig,
    source: Arc<dyn WeightSource>,
    target: &BuildTarget,
    mode: SequenceMode,
    interface: Interface,
) -> Result<Graph> {
    cfg.validate()?;
    mode.check(cfg)?;
    interface.check(mode)?;
    let (opset, forms) = (target.opset, target.forms);
    let builder = GraphBuilder::with_forms(opset, forms)?;
    let spelling = Spelling::of(cfg, mode, opset, forms)?;
    let mut em = Emitter::new(
        builder,
        cfg,
        spelling,
        interface,
        target.target.state_start(),
        param_specs(cfg),
        source,
    );
    let (x, embedding, mut sequence) = em.embed(mode)?;
    let stacked = em.stack(x, &mut sequence)?;
    let out = em.output(stacked, embedding)?;
    let position = sequence.static_position().cloned();
    let triton_next_position = sequence.triton_next_position().cloned();
    let mut present = sequence.into_present();
    let name = match cfg.task {
        Task::Backbone { .. } => LAST_HIDDEN_STATE,
        _ => LOGITS,
    };
    let out = em.cast_to(&format!("{name}_to_f32"), &out, ElemType::F32)?;
    let out = match interface {
        Interface::Genai {
            added_end_token: true,
        } => GenaiInterface::end_logit(&mut em, &out)?,
        _ => out,
    };
    let out = em.g.rename(&out, name)?;
    let mut outputs = vec![out.clone()];
    // The present_* outputs in the order of the past_* inputs (sgu, key, value per block;
    // genai's by layer).
    for present_name in present_order(cfg, mode, interface) {
        if let Some(k) = present.iter().position(|(name, _)| *name == present_name) {
            let (name, value) = present.remove(k);
            outputs.push(em.g.rename(&value, &name)?);
        }
    }
    if let Some(next) = triton_next_position {
        outputs.push(em.g.rename(&next, TRITON_NEXT_POSITION)?);
    }
    if interface == Interface::BoundStep {
        let position = position
            .ok_or_else(|| Error::Internal("a bound step without a static state".into()))?;
        outputs.extend(bound_step_outputs(&mut em.g, &out, &position)?);
    }
    Ok(em.g.finish("gmlp", outputs))
}

/// The names of the state outputs in their order: the `present_*` of every block (sgu,
/// key, value, shift), or genai's key and value of every layer.
fn present_order(cfg: &GmlpConfig, mode: SequenceMode, interface: Interface) -> Vec<String> {
    match interface {
        Interface::Genai { .. } => genai_layers(cfg)
            .iter()
            .flat_map(|layer| layer.tensors().map(|(_, present, _)| present))
            .collect(),
        Interface::File | Interface::BoundStep | Interface::Triton => mode_state(cfg, mode)
            .into_iter()
            .map(|state| state.present)
            .collect(),
    }
}

/// [`NEXT_INPUT_IDS`] = `ArgMax(logits)` over the vocabulary and [`NEXT_POSITION`] =
/// `position + 1`.
fn bound_step_outputs(
    g: &mut GraphBuilder,
    logits: &Value,
    position: &Value,
) -> Result<[Value; 2]> {
    let ids = g.scoped(NEXT_INPUT_IDS, |g| g.arg_max("argmax", logits, -1))?;
    let next = g.scoped(NEXT_POSITION, |g| {
        let one = g.const_i64("one", &[1], vec![1])?;
        g.add("add", position, &one)
    })?;
    Ok([
        g.rename(&ids, NEXT_INPUT_IDS)?,
        g.rename(&next, NEXT_POSITION)?,
    ])
}
