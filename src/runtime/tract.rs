//! tract (pure Rust, CPU): the file (`model_for_path`), or the model the tool decoded from
//! it (handed over in memory: tract-onnx parses its own protobuf types, so the decoded
//! model is encoded once for it rather than the file read and decoded again) → optimized
//! typed plan, symbolic batch kept.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ndarray::ArrayD;
use tract_onnx::prelude::*;

use crate::error::{contain_panic, one_line, Error, Remedy, Result};
use crate::runtime::{
    missing_output, CarriedState, Carry, ModelFile, Runtime, StateValue, TractOptions,
};
use crate::tensor::{with_array, NamedTensor, TensorValue};

/// A model loaded and optimized by tract.
pub struct TractRuntime {
    plan: Arc<TypedRunnableModel>,
    input_names: Vec<String>,
    output_names: Vec<String>,
    /// Nodes run as MatMul on dequantized weights, if any.
    dequantized: usize,
    /// The pool each run goes on, its matrix products split over its threads
    /// (`TractOptions::threads` above 1; see [`run_on_pool`]).
    pool: Option<Arc<rayon::ThreadPool>>,
}

/// The multiply-adds from which tract's pool splits a matrix-vector product over its threads
/// (tract-linalg's `set_threading_mac_threshold`, a setting of the whole process, made when a
/// runtime with a pool is opened). tract's own default, 2^21, keeps a decoding step's
/// projections (amlp-base: 512 × 3072, 1.6M) on one thread and splits only the head's; from
/// 2^18 they split too: the default file's static step on 2 threads took 17.0–17.7 ms at
/// tract's own threshold, against 12.8–13.6 ms with 2^18 (BENCHMARKS.md, "tract and ONNX
/// Runtime: tract at its own limit").
const POOLED_PRODUCT_MACS: usize = 1 << 18;

/// One run of `plan` on `pool`: one of its workers runs the plan, its matrix products split
/// over the pool (tract's `MultiThread` executor of the same pool), while each other worker
/// keeps looking for the run's work ([`keep_stealing`]) instead of going to sleep between
/// products. Run from the calling thread, as tract's executor alone would, each product woke
/// the pool and put the caller to sleep, and a worker asleep between two products was woken
/// again. The tract file's static step (amlp-base `--layers 6`, 2 threads) took 7.51–7.82
/// ms with the run on the pool and 5.50–6.04 ms with its workers kept awake, alternating
/// (ONNX Runtime's own threads spin likewise between its kernels; BENCHMARKS.md, "tract and
/// ONNX Runtime: tract at its own limit"). The values
/// cross to the worker as tensors (tract's run values are not `Send`), moved, not copied,
/// where they hold the only reference.
fn run_on_pool(
    plan: &Arc<TypedRunnableModel>,
    pool: &Arc<rayon::ThreadPool>,
    values: TVec<TValue>,
) -> TractResult<TVec<TValue>> {
    let executor = tract_linalg::multithread::Executor::MultiThread(pool.clone());
    let tensors: TVec<Tensor> = values.into_iter().map(TValue::into_tensor).collect();
    let others = pool.current_num_threads().saturating_sub(1);
    let results = pool.install(move || {
        let done = AtomicBool::new(false);
        let runner = rayon::current_thread_index();
        rayon::scope(|scope| {
            for _ in 0..others {
                let done = &done;
                scope.spawn(move |_| keep_stealing(done, runner));
            }
            let run = tract_linalg::multithread::multithread_tract_scope(executor, || {
                let values = tensors.into_iter().map(Tensor::into_tvalue).collect();
                plan.run(values)
                    .map(|r| r.into_iter().map(TValue::into_tensor).collect::<TVec<_>>())
            });
            done.store(true, Ordering::Release);
            run
        })
    })?;
    Ok(results.into_iter().map(Tensor::into_tvalue).collect())
}

/// A pool worker's part of a run it does not run itself: taking the run's pending work (a
/// product's share) until `done`, spinning while there is none. The worker that runs the
/// plan (`runner`), should it pick this job up itself, returns at once.
fn keep_stealing(done: &AtomicBool, runner: Option<usize>) {
    if rayon::current_thread_index() == runner {
        return;
    }
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::hint::spin_loop();
        }
    }
}

/// MatMulNBits code widths tract 0.23 reads itself (`tract-onnx`'s `mat_mul_nbits`).
const TRACT_NBITS: [i64; 2] = [2, 4];

/// Whether `model` has `MatMulNBits` nodes with codes tract does not read (see
/// [`TractRuntime::load_with`]).
pub fn needs_dequantizing(model: &crate::onnx::proto::ModelProto) -> bool {
    crate::onnx::dequantize::nbits_widths(model)
        .iter()
        .any(|b| !TRACT_NBITS.contains(b))
}

fn failed(e: impl std::fmt::Display) -> Error {
    Error::RuntimeFailed {
        runtime: "tract".into(),
        reason: one_line(format!("{e:#}")),
    }
}

/// tract's refusal to load `file`, said in our words where the file is one of ours that
/// tract cannot run by design: opset 24's `TensorScatter`, which tract 0.23 lacks, writes the
/// static state of `--target onnxruntime` files (exit 3, like a runtime that is not there).
/// The file's own nodes decide, not tract's wording; it is decoded for that (if the caller
/// has not) only once tract has refused it, so a file tract loads costs no second decode.
fn failed_to_load(file: ModelFile, e: impl std::fmt::Display) -> Error {
    refused(file.model().is_ok_and(|m| has_tensor_scatter(&m)), e)
}

/// Whether `model`'s graph has a `TensorScatter` node.
fn has_tensor_scatter(model: &crate::onnx::proto::ModelProto) -> bool {
    model
        .graph
        .as_ref()
        .is_some_and(|g| g.node.iter().any(|n| n.op_type() == "TensorScatter"))
}

/// [`failed_to_load`] of a model already known to have `TensorScatter` nodes or not.
fn refused(tensor_scatter: bool, e: impl std::fmt::Display) -> Error {
    if tensor_scatter {
        return no_tensor_scatter();
    }
    failed(e)
}

/// tract cannot run a file with `TensorScatter` nodes.
fn no_tensor_scatter() -> Error {
    Error::RuntimeUnavailable {
        runtime: "tract".into(),
        reason: "tract 0.23 has no TensorScatter, which writes this file's static state (opset 24, the onnxruntime target)".into(),
        remedy: Some(Remedy::OrtRuntimeOrOrtTarget),
    }
}

impl TractRuntime {
    /// Loads and optimizes `path` (external data files are resolved beside it).
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, false)
    }

    /// [`Self::load`]; with `dequantize_nbits`, the `MatMulNBits` nodes tract cannot read
    /// (8-bit codes) become `MatMul`s on weights dequantized from the file's blocks.
    pub fn load_with(path: &Path, dequantize_nbits: bool) -> Result<Self> {
        Self::load_file(ModelFile::from(path), dequantize_nbits)
    }

    /// [`Self::load_with`] of a file the caller may have decoded already: the file is
    /// decoded by the tool only to dequantize it, and not again if the caller has.
    pub fn load_file(file: ModelFile, dequantize_nbits: bool) -> Result<Self> {
        let options = TractOptions {
            dequantize_nbits,
            ..Default::default()
        };
        Self::load_file_with(file, &options)
    }

    /// [`Self::load_file`] with tract's `options` (its matrix products on
    /// `options.threads` threads).
    pub fn load_file_with(file: ModelFile, options: &TractOptions) -> Result<Self> {
        contain_panic("tract", || Self::load_unguarded(file, options))
    }

    fn load_unguarded(file: ModelFile, options: &TractOptions) -> Result<Self> {
        let dequantize_nbits = options.dequantize_nbits;
        // A model the caller decoded is checked before tract reads it; a file tract
        // refuses is checked then (see `failed_to_load`).
        if file.decoded.is_some_and(has_tensor_scatter) {
            return Err(no_tensor_scatter());
        }
        let path = file.path;
        let (model, dequantized) = match file.decoded {
            // The decoded model, handed to tract (dequantized first where asked and needed).
            Some(decoded) if dequantize_nbits && needs_dequantizing(decoded) => {
                Self::parse_dequantized(decoded.clone(), path)?
            }
            Some(decoded) => (Self::parse_proto(decoded, path)?, 0),
            // Not decoded yet: decoded here only if it may need dequantizing.
            None if dequantize_nbits => {
                let decoded = crate::onnx::reader::read_model(path)?;
                if needs_dequantizing(&decoded) {
                    Self::parse_dequantized(decoded, path)?
                } else {
                    (Self::parse_proto(&decoded, path)?, 0)
                }
            }
            None => (
                tract_onnx::onnx()
                    .model_for_path(path)
                    .map_err(|e| failed_to_load(file, e))?,
                0,
            ),
        };
        let input_names = model
            .input_outlets()
            .map_err(failed)?
            .iter()
            .map(|o| model.node(o.node).name.clone())
            .collect();
        let output_names = model
            .output_outlets()
            .map_err(failed)?
            .iter()
            .map(|o| {
                model
                    .outlet_label(*o)
                    .map(str::to_string)
                    .unwrap_or_else(|| model.node(o.node).name.clone())
            })
            .collect();
        let mut typed = model.into_typed().map_err(|e| failed_to_load(file, e))?;
        own_copy_of_shared_weights(&mut typed).map_err(failed)?;
        // The plan has no executor of its own: each run picks one ([`Self::run_plan`]).
        let plan = typed
            .into_optimized()
            .map_err(|e| failed_to_load(file, e))?
            .into_runnable_with_options(&RunOptions::default())
            .map_err(|e| failed_to_load(file, e))?;
        Ok(TractRuntime {
            plan,
            input_names,
            output_names,
            dequantized,
            pool: match options.threads {
                0 | 1 => None,
                threads => {
                    tract_linalg::multithread::set_threading_mac_threshold(POOLED_PRODUCT_MACS);
                    Some(Arc::new(
                        rayon::ThreadPoolBuilder::new()
                            .thread_name(|k| format!("tract-{k}"))
                            .num_threads(threads)
                            .build()
                            .map_err(failed)?,
                    ))
                }
            },
        })
    }

    /// `proto`, the model of `path`, with its unreadable MatMulNBits nodes dequantized,
    /// parsed by tract (external data still resolved beside `path`), and how many were
    /// rewritten.
    fn parse_dequantized(
        mut proto: crate::onnx::proto::ModelProto,
        path: &Path,
    ) -> Result<(InferenceModel, usize)> {
        let n = crate::onnx::dequantize::dequantize_matmul_nbits(&mut proto, path, |bits| {
            TRACT_NBITS.contains(&bits)
        })?;
        Ok((Self::parse_proto(&proto, path)?, n))
    }

    /// `proto`, the model of `path`, parsed by tract (external data still resolved beside
    /// `path`).
    fn parse_proto(proto: &crate::onnx::proto::ModelProto, path: &Path) -> Result<InferenceModel> {
        let dir = path.parent().unwrap_or(Path::new("."));
        // tract-onnx's `pb` types are prost's of the same version as ours, from its own
        // copy of onnx.proto: the bytes are the one way across.
        let bytes = prost::Message::encode_to_vec(proto);
        let pb: tract_onnx::pb::ModelProto =
            prost::Message::decode(bytes.as_slice()).map_err(failed)?;
        drop(bytes);
        let tensor_scatter = has_tensor_scatter(proto);
        let parsed = tract_onnx::onnx()
            .parse(&pb, dir.to_str())
            .map_err(|e| refused(tensor_scatter, e))?;
        if !parsed.unresolved_inputs.is_empty() {
            return Err(failed(format!(
                "could not resolve inputs {:?}",
                parsed.unresolved_inputs
            )));
        }
        Ok(parsed.model)
    }
}

/// Gives every reader of a weight read by several nodes its own constant node (the same
/// tensor, shared, not copied). tract folds the work on a constant (a `Transpose`, the
/// packing of a MatMul's weight into its kernel's panels) into a new constant once, at
/// load, except where the constant has several readers and is larger than
/// `CONST_FOLD_MEM_BUDGET` (4 MB, tract-core 0.23 `optim/prop_const.rs`), so that a large
/// weight is not duplicated per reader. The tied embedding of a token model is such a
/// weight: read by the input's `Gather` and by the head's `Transpose` → `MatMul`, it was
/// transposed and packed again on every run (amlp-base: 65 MB, ~16k page faults per
/// decoding step). Split, the head's copy is folded once; the `Gather` keeps the table.
fn own_copy_of_shared_weights(model: &mut TypedModel) -> TractResult<()> {
    use tract_onnx::tract_core::ops::konst::Const;
    let shared: Vec<(usize, Arc<Tensor>)> = model
        .nodes()
        .iter()
        .filter(|n| n.outputs.len() == 1 && n.outputs[0].successors.len() > 1)
        .filter_map(|n| {
            let value = n.op_as::<Const>()?.val().clone();
            let bytes = value.datum_type().size_of() * value.volume();
            (bytes as u64 > tract_onnx::tract_core::optim::CONST_FOLD_MEM_BUDGET)
                .then_some((n.id, value))
        })
        .collect();
    for (node, value) in shared {
        let readers = model.nodes()[node].outputs[0].successors.clone();
        let name = model.nodes()[node].name.clone();
        for (k, reader) in readers.into_iter().enumerate().skip(1) {
            // A node of its own: `add_const` would hand back the shared one (it merges
            // equal values).
            let fact = TypedFact::try_from(value.clone())?;
            let copy: OutletId = model
                .add_node(
                    format!("{name}.reader{k}"),
                    Const::new(value.clone())?,
                    tvec!(fact),
                )?
                .into();
            model.add_edge(copy, reader)?;
        }
    }
    Ok(())
}

impl Runtime for TractRuntime {
    fn name(&self) -> &str {
        "tract"
    }

    fn run(&mut self, inputs: &[NamedTensor]) -> Result<Vec<NamedTensor>> {
        let mut outputs = Vec::new();
        self.run_into(inputs, &mut outputs)?;
        Ok(outputs)
    }

    fn run_into(&mut self, inputs: &[NamedTensor], outputs: &mut Vec<NamedTensor>) -> Result<()> {
        contain_panic("tract", || self.run_into_unguarded(inputs, outputs))
    }

    fn run_carrying(
        &mut self,
        inputs: &[NamedTensor],
        state: &mut CarriedState,
        carry: &[Carry],
    ) -> Result<Vec<NamedTensor>> {
        contain_panic("tract", || {
            self.run_carrying_unguarded(inputs, state, carry)
        })
    }

    fn note(&self) -> Option<String> {
        (self.dequantized > 0).then(|| {
            let n = self.dequantized;
            let nodes = if n == 1 { "node" } else { "nodes" };
            format!(
                "{n} MatMulNBits {nodes} with codes tract does not read (it reads 2 and 4 bits) ran as MatMul on weights gmlp-onnx dequantized from the file's blocks"
            )
        })
    }
}

/// A value a tract plan returned, held to be fed back to it as it is (no copy to or from
/// host arrays between runs: [`Runtime::run_carrying`]).
pub struct TractValue(TValue);

impl TractValue {
    /// A host copy of the value.
    pub fn to_host(&self) -> Result<TensorValue> {
        host_value(&self.0)
    }
}

/// A host array as the tensor tract reads (one copy, into the aligned storage tract's
/// tensors own).
fn tract_tensor(name: &str, value: &TensorValue) -> Result<Tensor> {
    with_array!(value, a => {
        let a = a.as_standard_layout();
        let data = a
            .as_slice()
            .ok_or_else(|| Error::Internal(format!("input {name} is not contiguous")))?;
        Tensor::from_shape(a.shape(), data).map_err(failed)
    })
}

/// tract's output `t` as a new host array.
fn host_value(t: &Tensor) -> Result<TensorValue> {
    let fresh = |a: Option<TensorValue>| a.ok_or_else(|| Error::Internal("no array".into()));
    match t.datum_type() {
        DatumType::F32 => fresh(copy_out::<f32>(t, None)?.map(TensorValue::F32)),
        DatumType::F64 => fresh(copy_out::<f64>(t, None)?.map(TensorValue::F64)),
        DatumType::I32 => fresh(copy_out::<i32>(t, None)?.map(TensorValue::I32)),
        DatumType::I64 => fresh(copy_out::<i64>(t, None)?.map(TensorValue::I64)),
        DatumType::TDim => fresh(copy_out::<i64>(&shape_values(t)?, None)?.map(TensorValue::I64)),
        other => Err(failed(format!(
            "an output of type {other:?}; only float32, float64, int32 and int64 outputs are compared"
        ))),
    }
}

impl TractRuntime {
    /// [`Runtime::run_carrying`]: the carried values are tract's own, moved into the run
    /// (the state holds no other reference, so that an op whose input is the value's last
    /// use, a static state's `ScatterND`, writes its rows into that very tensor instead of
    /// copying it whole first), and the carried outputs kept as they came. Inputs whose
    /// shapes the plan refuses are refused before the state moves ([`Self::check_shapes`]:
    /// the state is left as it was); a run that fails after that has spent its state, and
    /// the next one is refused, saying so.
    fn run_carrying_unguarded(
        &self,
        inputs: &[NamedTensor],
        state: &mut CarriedState,
        carry: &[Carry],
    ) -> Result<Vec<NamedTensor>> {
        let mut values: TVec<TValue> = tvec!();
        self.check_shapes(inputs, state)?;
        for name in &self.input_names {
            let value = match inputs.iter().find(|t| &t.name == name) {
                Some(t) => tract_tensor(name, &t.value)?.into_tvalue(),
                None => match state.values.iter_mut().find(|(n, _)| n == name) {
                    Some((_, held @ StateValue::Tract(_))) => {
                        let StateValue::Tract(TractValue(v)) =
                            std::mem::replace(held, StateValue::Spent)
                        else {
                            unreachable!("matched as tract's own")
                        };
                        v
                    }
                    Some((_, StateValue::Spent)) => {
                        return Err(Error::RuntimeFailed {
                            runtime: "tract".into(),
                            reason: format!(
                                "the state {name} was spent by a run that failed; start the sequences again"
                            ),
                        })
                    }
                    Some((_, held)) => tract_tensor(name, &held.to_host()?)?.into_tvalue(),
                    None => {
                        return Err(Error::BadTensor(format!(
                            "no value given for model input {name}"
                        )))
                    }
                },
            };
            values.push(value);
        }
        let results = self.run_plan(values)?;
        let mut carried: Vec<Option<TValue>> = vec![None; carry.len()];
        let mut rest = Vec::new();
        for (t, name) in results.into_iter().zip(&self.output_names) {
            match carry.iter().position(|pair| &pair.output == name) {
                Some(k) => carried[k] = Some(t),
                None => rest.push(NamedTensor {
                    name: name.clone(),
                    value: host_value(&t)?,
                }),
            }
        }
        if !carry.is_empty() {
            state.values = carry
                .iter()
                .zip(carried)
                .map(|(pair, value)| {
                    let value = value.ok_or_else(|| missing_output("tract", &pair.output))?;
                    Ok((pair.input.clone(), StateValue::Tract(TractValue(value))))
                })
                .collect::<Result<Vec<_>>>()?;
        }
        Ok(rest)
    }

    /// One run of the plan: on the pool where there is one ([`run_on_pool`]), else on the
    /// calling thread.
    fn run_plan(&self, values: TVec<TValue>) -> Result<TVec<TValue>> {
        match &self.pool {
            Some(pool) => run_on_pool(&self.plan, pool, values),
            None => self.plan.run(values),
        }
        .map_err(failed)
    }

    /// Refuses inputs (given or carried) of a shape the plan's input facts exclude: a
    /// fixed dimension of another size, or a named one (`batch`) of two sizes.
    fn check_shapes(&self, inputs: &[NamedTensor], state: &CarriedState) -> Result<()> {
        let mut bound: Vec<(Symbol, usize)> = Vec::new();
        for (k, name) in self.input_names.iter().enumerate() {
            let shape: Vec<usize> = match inputs.iter().find(|t| &t.name == name) {
                Some(t) => t.value.shape().to_vec(),
                None => match state.values.iter().find(|(n, _)| n == name) {
                    Some((_, StateValue::Tract(TractValue(v)))) => v.shape().to_vec(),
                    Some((_, StateValue::Host(t))) => t.shape().to_vec(),
                    _ => continue,
                },
            };
            let fact = self.plan.model().input_fact(k).map_err(failed)?;
            let refused = |why: String| {
                Err(Error::BadTensor(format!(
                    "input {name} of shape {shape:?}: {why}"
                )))
            };
            if fact.rank() != shape.len() {
                return refused(format!("the model takes rank {}", fact.rank()));
            }
            for (axis, (dim, &size)) in fact.shape.iter().zip(&shape).enumerate() {
                if let Ok(fixed) = dim.to_i64() {
                    let fixed = fixed as usize;
                    if fixed != size {
                        return refused(format!("axis {axis} must be {fixed}"));
                    }
                } else if let TDim::Sym(symbol) = dim {
                    match bound.iter().find(|(s, _)| s == symbol) {
                        Some((_, seen)) if *seen != size => {
                            return refused(format!(
                                "axis {axis} ({symbol}) is {seen} in another input"
                            ))
                        }
                        Some(_) => {}
                        None => bound.push((symbol.clone(), size)),
                    }
                }
            }
        }
        Ok(())
    }

    fn run_into_unguarded(
        &self,
        inputs: &[NamedTensor],
        outputs: &mut Vec<NamedTensor>,
    ) -> Result<()> {
        let mut values: TVec<TValue> = tvec!();
        for name in &self.input_names {
            let input = inputs.iter().find(|t| &t.name == name).ok_or_else(|| {
                Error::BadTensor(format!("no value given for model input {name}"))
            })?;
            values.push(tract_tensor(name, &input.value)?.into_tvalue());
        }
        let results = self.run_plan(values)?;
        outputs.truncate(results.len());
        for (i, (t, name)) in results.iter().zip(&self.output_names).enumerate() {
            // The array in place when it is this output's, of its type (copy_out checks
            // the shape).
            macro_rules! out {
                ($variant:ident, $ty:ty) => {{
                    let slot = match outputs.get_mut(i) {
                        Some(NamedTensor {
                            name: n,
                            value: TensorValue::$variant(a),
                        }) if *n == *name => Some(a),
                        _ => None,
                    };
                    copy_out::<$ty>(t, slot)?.map(TensorValue::$variant)
                }};
            }
            let fresh = match t.datum_type() {
                DatumType::F32 => out!(F32, f32),
                DatumType::F64 => out!(F64, f64),
                DatumType::I32 => out!(I32, i32),
                DatumType::I64 => out!(I64, i64),
                DatumType::TDim => {
                    let slot = match outputs.get_mut(i) {
                        Some(NamedTensor {
                            name: n,
                            value: TensorValue::I64(a),
                        }) if *n == *name => Some(a),
                        _ => None,
                    };
                    copy_out::<i64>(&shape_values(t)?, slot)?.map(TensorValue::I64)
                }
                other => {
                    return Err(failed(format!(
                        "output {name} has type {other:?}; only float32, float64, int32 and int64 outputs are compared"
                    )))
                }
            };
            if let Some(value) = fresh {
                let fresh = NamedTensor {
                    name: name.clone(),
                    value,
                };
                if i < outputs.len() {
                    outputs[i] = fresh;
                } else {
                    outputs.push(fresh);
                }
            }
        }
        Ok(())
    }
}

/// An int64 output that tract computed as its dimension type (values derived from shapes
/// or from rows it folded symbolically), as the int64 values the graph declares.
fn shape_values(t: &Tensor) -> Result<Tensor> {
    t.cast_to::<i64>().map(|t| t.into_owned()).map_err(failed)
}

/// Copies tract's output `t` into `slot` when that holds an array of its shape (`None`
/// back), else into a new array.
fn copy_out<T: Datum + Clone>(
    t: &Tensor,
    slot: Option<&mut ArrayD<T>>,
) -> Result<Option<ArrayD<T>>> {
    let view = t.to_plain_array_view::<T>().map_err(failed)?;
    match slot {
        Some(a) if a.shape() == view.shape() => {
            a.assign(&view);
            Ok(None)
        }
        _ => Ok(Some(view.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::builder::GraphBuilder;
    use crate::onnx::graph::{Dim, ElemType};
    use crate::onnx::writer::{encode_model_to_vec, ModelInfo};

    /// A file whose one node writes `update` [1, 1, 2] into `past` [1, 4, 2] with opset
    /// 24's `TensorScatter`.
    fn tensor_scatter_file(dir: &Path) -> std::path::PathBuf {
        let mut g = GraphBuilder::new(24).unwrap();
        let fixed = |dims: &[usize]| dims.iter().map(|&d| Dim::Fixed(d)).collect();
        let past = g.input("past", ElemType::F32, fixed(&[1, 4, 2])).unwrap();
        let update = g.input("update", ElemType::F32, fixed(&[1, 1, 2])).unwrap();
        let at = g
            .input("write_indices", ElemType::I64, fixed(&[1]))
            .unwrap();
        let y = g.tensor_scatter("y", &past, &update, &at, 1).unwrap();
        let bytes = encode_model_to_vec(&g.finish("g", vec![y]), &ModelInfo::default()).unwrap();
        let path = dir.join("scatter.onnx");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_file_with_tensor_scatter_is_refused_by_its_nodes_decoded_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let unavailable = |r: Result<TractRuntime>| {
            matches!(
                r,
                Err(Error::RuntimeUnavailable {
                    remedy: Some(Remedy::OrtRuntimeOrOrtTarget),
                    ..
                })
            )
        };
        let path = tensor_scatter_file(dir.path());
        // Not decoded: tract refuses it, then its nodes say why.
        assert!(unavailable(TractRuntime::load(&path)));
        // Decoded by the caller: refused before tract reads it.
        let model = crate::onnx::reader::read_model(&path).unwrap();
        let decoded = ModelFile::decoded(&path, &model);
        assert!(unavailable(TractRuntime::load_file(decoded, false)));
        // Any other refusal is tract's failure.
        let other = dir.path().join("other.onnx");
        std::fs::write(&other, b"not an ONNX file").unwrap();
        assert!(matches!(
            TractRuntime::load(&other),
            Err(Error::RuntimeFailed { .. })
        ));
    }

    /// A model the caller decoded is what tract parses: the file is not read again (here
    /// it is gone by then), and the runtime runs as one loaded from the file does.
    #[test]
    fn tract_is_given_the_decoded_model() {
        let dir = tempfile::tempdir().unwrap();
        let path =
            crate::runtime::testing::write_tiny(dir.path(), crate::gmlp::SequenceMode::Variable);
        let ids = NamedTensor {
            name: "input_ids".into(),
            value: TensorValue::I64(ndarray::array![[3i64, 17, 5]].into_dyn()),
        };
        let from_file = TractRuntime::load(&path)
            .unwrap()
            .run(std::slice::from_ref(&ids))
            .unwrap();
        let model = crate::onnx::reader::read_model(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        for dequantize in [false, true] {
            let mut rt =
                TractRuntime::load_file(ModelFile::decoded(&path, &model), dequantize).unwrap();
            assert_eq!(rt.run(std::slice::from_ref(&ids)).unwrap(), from_file);
        }
        assert!(TractRuntime::load(&path).is_err(), "the file is gone");
    }
}
