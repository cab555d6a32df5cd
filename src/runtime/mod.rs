//! Runtimes that execute an ONNX file behind one small trait: tract (CPU) and ONNX
//! Runtime through `ort` (CPU or CUDA execution provider).

use std::path::Path;

use ndarray::ArrayD;

use crate::error::{Error, Result};

pub mod onnxruntime;
pub mod tract;

/// Tensor contents exchanged with runtimes.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorValue {
    /// f32 tensor.
    F32(ArrayD<f32>),
    /// i64 tensor.
    I64(ArrayD<i64>),
}

impl TensorValue {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            TensorValue::F32(a) => a.shape(),
            TensorValue::I64(a) => a.shape(),
        }
    }
    /// The values as f64 (for comparisons), row-major.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            TensorValue::F32(a) => a.iter().map(|&v| f64::from(v)).collect(),
            TensorValue::I64(a) => a.iter().map(|&v| v as f64).collect(),
        }
    }
}

/// A named tensor: a model input or output.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    /// Input or output name in the graph.
    pub name: String,
    /// Contents.
    pub value: TensorValue,
}

/// Which runtime to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuntimeKind {
    /// tract, pure Rust, CPU.
    Tract,
    /// ONNX Runtime, CPU execution provider.
    OrtCpu,
    /// ONNX Runtime, CUDA execution provider (no silent CPU fallback).
    OrtCuda,
}

impl RuntimeKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::Tract => "tract",
            RuntimeKind::OrtCpu => "ort-cpu",
            RuntimeKind::OrtCuda => "ort-cuda",
        }
    }

    /// Parses a comma-separated list such as `tract,ort-cpu`.
    pub fn parse_list(list: &str) -> Result<Vec<RuntimeKind>> {
        let mut out = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let kind = match item {
                "tract" => RuntimeKind::Tract,
                "ort-cpu" | "ort" => RuntimeKind::OrtCpu,
                "ort-cuda" => RuntimeKind::OrtCuda,
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "unknown runtime '{other}' (known: tract, ort-cpu, ort-cuda)"
                    )))
                }
            };
            if !out.contains(&kind) {
                out.push(kind);
            }
        }
        if out.is_empty() {
            return Err(Error::InvalidArgument("no runtime given".into()));
        }
        Ok(out)
    }
}

/// Options shared by runtimes.
#[derive(Clone, Debug, Default)]
pub struct RuntimeOptions {
    /// Path of `libonnxruntime.so`; otherwise found as [`onnxruntime::find_library`] says.
    pub ort_library: Option<std::path::PathBuf>,
    /// Allow TF32 math on the CUDA execution provider (off by default for parity).
    pub cuda_tf32: bool,
    /// Intra-op threads for ONNX Runtime (0 = its default).
    pub threads: usize,
}

/// A loaded model that can be run repeatedly.
pub trait Runtime {
    /// Runtime name for reports (`tract`, `ort-cpu`, `ort-cuda`).
    fn name(&self) -> &str;
    /// Runs the model; inputs are matched by name, outputs come back in graph order.
    fn run(&mut self, inputs: &[NamedTensor]) -> Result<Vec<NamedTensor>>;
}

/// Loads `model` in the runtime `kind`.
pub fn open(kind: RuntimeKind, model: &Path, options: &RuntimeOptions) -> Result<Box<dyn Runtime>> {
    match kind {
        RuntimeKind::Tract => Ok(Box::new(tract::TractRuntime::load(model)?)),
        RuntimeKind::OrtCpu | RuntimeKind::OrtCuda => Ok(Box::new(onnxruntime::OrtRuntime::load(
            model,
            kind == RuntimeKind::OrtCuda,
            options,
        )?)),
    }
}
