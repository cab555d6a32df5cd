//! The state every part of the emitter shares: the graph builder, the configuration, the
//! parameters by name with the source of their values, and the constants shared by the
//! blocks (Toeplitz index table, causal mask). What only one sequence mode has (positions,
//! state inputs and outputs) is not here: it lives in that mode's variant of the
//! `Sequence` enum (sequence.rs), which the parts take as an argument.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, NormKind, Precision, StackKind};
use crate::gmlp::interface::{first_local_block, Interface, SequenceMode, StateStart};
use crate::gmlp::weights::{check_values, columns_spec, ParamSpec, WeightSource};
use crate::message::{Phrase, Setting};
use crate::onnx::builder::GraphBuilder;
use crate::onnx::forms::{Fusions, OpForms};
use crate::onnx::graph::{ElemType, F32Sink, TensorData, Value};
use crate::onnx::ops::{ATTENTION_OPSET, TENSOR_SCATTER_OPSET};

/// The op spelling of the one block recipe (block/mod.rs): which nodes each part writes for
/// the same computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spelling {
    /// Standard ONNX operators node by node, which every consumer reads.
    Standard,
    /// ONNX Runtime's fused kernels (`--target onnxruntime`, every sequence mode):
    /// `SkipLayerNormalization` carrying the residual and the output projection's bias, one
    /// joined input projection `[U | W_qkv]` and a `Split`, ONNX `Attention`, the gate's
    /// terms in one `Sum`, and a static state indexed in i64 and read as it is (it starts
    /// zeroed: static_state/int_rows.rs).
    Fused(Joins),
}

/// How far a fused graph joins nodes beyond ONNX Runtime's kernels, by what bounds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Joins {
    /// The static step, bound by kernel launches (one token a run): the input projections
    /// joined into one MatMul and a `Split`, the gate's terms and biases in one `Sum`.
    Step,
    /// The whole-sequence forms (a forward, a prefill, the growing state), bound by their
    /// products: each projection its own MatMul with its bias (ONNX Runtime's CPU fuses
    /// each bias into its GELU), the gate's terms added in turn. Measured on the g-mlp-pytorch
    /// aMLP (BENCHMARKS.md, "Ours vs torch.onnx.export"): with the step's joins this forward
    /// took 0.771 of the export's time, against 0.697 without.
    Sequence,
}

impl Spelling {
    /// The spelling of `cfg` emitted in `mode` at `opset` with `forms`: fused for a profile
    /// that asks for ONNX Runtime's fusions (`--target onnxruntime`), standard otherwise. A
    /// model the fused kernels cannot express ([`fused_gap`]) is refused for that profile,
    /// never written in standard operators under its name.
    pub(crate) fn of(
        cfg: &GmlpConfig,
        mode: SequenceMode,
        opset: i64,
        forms: OpForms,
    ) -> Result<Spelling> {
        if forms.fusions == Fusions::Standard {
            return Ok(Spelling::Standard);
        }
        let joins = match mode {
            SequenceMode::Static => Joins::Step,
            _ => Joins::Sequence,
        };
        match fused_gap(cfg, mode, opset) {
            None => Ok(Spelling::Fused(joins)),
            Some(gap) => Err(Error::Setting(
                Phrase::setting(Setting::Target)
                    .then(format!(
                        " onnxruntime writes ONNX Runtime's fused kernels, which do not cover {gap}; use "
                    ))
                    .and(Setting::Target)
                    .then(" ort (standard operators, which ONNX Runtime fuses at load where it can)"),
            )),
        }
    }
}

/// What of `cfg`, in `mode` at `opset`, the fused spelling cannot express, in words; `None`
/// where it expresses all of it. It takes LayerNorm (its `SkipLayerNormalization` carries
/// the residual), sequential blocks that mix tokens globally, f32 or block-quantized
/// (`MatMulNBits`) projections, opset 23 for an aMLP's `Attention` and 24 for a static
/// state's `TensorScatter`, and a static state without token shift (whose rows it reads
/// in f32).
pub fn fused_gap(cfg: &GmlpConfig, mode: SequenceMode, opset: i64) -> Option<String> {
    let needed = match (mode, cfg.attn_dim) {
        (SequenceMode::Static, _) => Some((TENSOR_SCATTER_OPSET, "a static state's TensorScatter")),
        (_, Some(_)) => Some((ATTENTION_OPSET, "the tiny attention's Attention")),
        (_, None) => None,
    };
    if cfg.block.norm != NormKind::LayerNorm {
        return Some("RMSNorm".into());
    }
    if !matches!(cfg.block.stack, StackKind::Sequential) {
        return Some("a reversible stack".into());
    }
    if !matches!(
        cfg.dtype,
        Precision::F32 | Precision::Int4 | Precision::Int8WeightOnly
    ) {
        return Some(format!("{} weights", cfg.dtype.name()));
    }
    if let Some(i) = first_local_block(cfg) {
        return Some(format!("local token mixing (block {i}'s window or fold)"));
    }
    if mode == SequenceMode::Static && cfg.shift_tokens > 0 {
        return Some("the token shift of a static state".into());
    }
    match needed {
        Some((at, what)) if opset < at => Some(format!("opset {opset} ({what} needs {at})")),
        _ => None,
    }
}

/// The emitter: one graph under construction for one configuration, the context every part
/// writes into (the builder, the configuration, the spelling and interface, the parameters
/// by name). Its own methods are the network's frame (embed.rs, stack.rs, head.rs, the
/// block recipe in block/mod.rs) and the projections every part uses (linear.rs); each part
/// of a block (`BlockNorm`, `TokenShift`, `ChannelProjections`, `TinyAttention`,
/// `SpatialProjection`, `SpatialGatingUnit`, `LocalMixing`, `AxialFold`) and of the
/// sequence axis (`SequenceAxis`, `StaticStatePart`, `GenaiInterface`) is a type of its own
/// whose functions take the emitter.
pub(crate) struct Emitter {
    /// The graph under construction.
    pub(crate) g: GraphBuilder,
    /// The architecture being emitted.
    pub(crate) cfg: GmlpConfig,
    /// The op spelling every part writes.
    pub(crate) spelling: Spelling,
    /// What the graph offers beyond the file's interface.
    pub(crate) interface: Interface,
    /// What a static state's buffers hold before a sequence's first run (the target's):
    /// with [`StateStart::Zeroed`] the blocks read every row as it is.
    pub(crate) state_start: StateStart,
    specs: HashMap<String, ParamSpec>,
    source: Arc<dyn WeightSource>,
    /// The shared Toeplitz index table `idx[i][j] = j − i + n − 1` (made on first use).
    pub(crate) toeplitz_index: Option<Value>,
    /// The shared additive causal mask [n, n] (made on first use).
    pub(crate) causal_mask: Option<Value>,
}

impl Emitter {
    /// A new emitter of `cfg` into `g` in `spelling` with `interface`, for static-state
    /// buffers that start as `state_start` says, with parameter values from `source`.
    pub(crate) fn new(
        g: GraphBuilder,
        cfg: &GmlpConfig,
        spelling: Spelling,
        interface: Interface,
        state_start: StateStart,
        specs: Vec<ParamSpec>,
        source: Arc<dyn WeightSource>,
    ) -> Emitter {
        Emitter {
            g,
            cfg: cfg.clone(),
            spelling,
            interface,
            state_start,
            specs: specs.into_iter().map(|s| (s.name.clone(), s)).collect(),
            source,
            toeplitz_index: None,
            causal_mask: None,
        }
    }

    /// The specification of parameter `name`.
    pub(crate) fn spec(&self, name: &str) -> Result<ParamSpec> {
        self.specs
            .get(name)
            .cloned()
            .ok_or_else(|| Error::InvalidConfig(format!("no parameter named {name}")))
    }

    /// A parameter whose values, produced when the file is written, are checked and then
    /// passed through `post` and stored with dimensions `dims`.
    pub(crate) fn lazy_param(
        &mut self,
        name: &str,
        dims: &[usize],
        post: impl Fn(Vec<f32>) -> Vec<f32> + Send + Sync + 'static,
    ) -> Result<Value> {
        self.lazy_param_as(name, dims, self.cfg.dtype.elem(), post)
    }

    /// [`Self::lazy_param`] stored as `elem`.
    pub(crate) fn lazy_param_as(
        &mut self,
        name: &str,
        dims: &[usize],
        elem: ElemType,
        post: impl Fn(Vec<f32>) -> Vec<f32> + Send + Sync + 'static,
    ) -> Result<Value> {
        self.derived_param(name, name, dims, elem, post)
    }

    /// An initializer named `init_name` whose values are those of the parameter `param`
    /// (checked), passed through `post` when the file is written, stored as `elem`.
    pub(crate) fn derived_param(
        &mut self,
        init_name: &str,
        param: &str,
        dims: &[usize],
        elem: ElemType,
        post: impl Fn(Vec<f32>) -> Vec<f32> + Send + Sync + 'static,
    ) -> Result<Value> {
        self.derived_param_try(init_name, param, dims, elem, move |v| Ok(post(v)))
    }

    /// [`Self::derived_param`] with a `post` that may refuse the values (a weight that
    /// cannot be quantized).
    pub(crate) fn derived_param_try(
        &mut self,
        init_name: &str,
        param: &str,
        dims: &[usize],
        elem: ElemType,
        post: impl Fn(Vec<f32>) -> Result<Vec<f32>> + Send + Sync + 'static,
    ) -> Result<Value> {
        let params = [param.to_string()];
        self.joined_param(init_name, &params, dims, elem, move |mut v| {
            post(v.remove(0))
        })
    }

    /// An initializer named `init_name` made from the values of several parameters
    /// `params` (each checked), in that order, by `join` when the file is written (the
    /// columns of several weights side by side, for one MatMul where there were several).
    pub(crate) fn joined_param(
        &mut self,
        init_name: &str,
        params: &[String],
        dims: &[usize],
        elem: ElemType,
        join: impl Fn(Vec<Vec<f32>>) -> Result<Vec<f32>> + Send + Sync + 'static,
    ) -> Result<Value> {
        let specs = params
            .iter()
            .map(|p| self.spec(p))
            .collect::<Result<Vec<_>>>()?;
        let source = self.source.clone();
        let produce = move || {
            let mut values = Vec::with_capacity(specs.len());
            for spec in &specs {
                let v = source.values(spec)?;
                check_values(spec, &v)?;
                values.push(v);
            }
            join(values)
        };
        self.g
            .weight_as(init_name, dims, elem, TensorData::produced(produce))
    }

    /// An initializer named `init_name` holding the parameter `param` as it is (checked
    /// finite by the source as it streams), with dimensions `dims` (its element count), streamed from the source when the
    /// file is written ([`WeightSource::stream`]: a checkpoint's bytes a run at a time),
    /// stored as `elem`.
    pub(crate) fn stored_param(
        &mut self,
        init_name: &str,
        param: &str,
        dims: &[usize],
        elem: ElemType,
    ) -> Result<Value> {
        let spec = self.spec(param)?;
        let source = self.source.clone();
        let stream = move |sink: &mut F32Sink<'_>| {
            let mut counted = counted_runs(&spec, sink);
            source.stream(&spec, &mut counted)
        };
        self.g
            .weight_as(init_name, dims, elem, TensorData::LazyF32(Arc::new(stream)))
    }

    /// An initializer named `init_name`: columns `[start, end)` of the 2-D parameter
    /// `param` (checked finite), streamed from the source when the file is written
    /// ([`WeightSource::stream_columns`]: a checkpoint reads only those), stored as `elem`.
    pub(crate) fn column_param(
        &mut self,
        init_name: &str,
        param: &str,
        (start, end): (usize, usize),
        elem: ElemType,
    ) -> Result<Value> {
        let spec = self.spec(param)?;
        let dims = [spec.shape[0], end - start];
        let part = columns_spec(&spec, start, end);
        let source = self.source.clone();
        let stream = move |sink: &mut F32Sink<'_>| {
            let mut counted = counted_runs(&part, sink);
            source.stream_columns(&spec, start, end, &mut counted)
        };
        self.g.weight_as(
            init_name,
            &dims,
            elem,
            TensorData::LazyF32(Arc::new(stream)),
        )
    }

    /// A parameter stored as is, in the model's storage type.
    pub(crate) fn param(&mut self, name: &str) -> Result<Value> {
        let dims = self.spec(name)?.shape;
        self.reshaped_param(name, &dims)
    }

    /// A parameter stored as is with dimensions `dims` (its element count), in the model's
    /// storage type.
    pub(crate) fn reshaped_param(&mut self, name: &str, dims: &[usize]) -> Result<Value> {
        self.stored_param(name, name, dims, self.cfg.dtype.elem())
    }

    /// Casts `x` to `to` if it is of another type.
    pub(crate) fn cast_to(&mut self, local: &str, x: &Value, to: ElemType) -> Result<Value> {
        if x.elem == to {
            Ok(x.clone())
        } else {
            self.g.cast(local, x, to)
        }
    }

    /// Runs `f` with `name` appended to the node-name scope.
    pub(crate) fn scoped<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        self.g.push_scope(name);
        let out = f(self);
        self.g.pop_scope();
        out
    }
}

/// `sink` behind a count of `spec`'s values: no more of them than `spec` has (the writer
/// checks that none are missing; [`WeightSource::stream`] has checked each run finite).
fn counted_runs<'a, 's: 'a>(
    spec: &'a ParamSpec,
    sink: &'a mut F32Sink<'s>,
) -> impl FnMut(std::borrow::Cow<'_, [f32]>) -> Result<()> + use<'a, 's> {
    let mut seen = 0usize;
    move |run| {
        seen += run.len();
        if seen > spec.len() {
            return Err(Error::BadTensor(format!(
                "{}: expected {} values for shape {:?}, got more",
                spec.name,
                spec.len(),
                spec.shape
            )));
        }
        sink(run)
    }
}
