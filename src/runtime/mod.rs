//! Runtimes that execute an ONNX file behind one small trait: tract (CPU) and ONNX
//! Runtime through `ort` (CPU or CUDA execution provider).

use std::path::Path;

use crate::error::{Error, Result};
use crate::tensor::NamedTensor;

pub mod decoder;
pub mod discovery;
pub mod onnxruntime;
pub mod tract;

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
    /// Refuse a CUDA session whose graph cannot be placed entirely on the CUDA execution
    /// provider (ONNX Runtime's `session.disable_cpu_ep_fallback`).
    pub cuda_no_cpu_fallback: bool,
    /// Enable ONNX Runtime profiling with this file prefix, so that [`Runtime::placement`]
    /// can report where each node ran.
    pub ort_profile_prefix: Option<std::path::PathBuf>,
}

/// Number of graph nodes that ran on each execution provider, by provider name.
pub type Placement = std::collections::BTreeMap<String, usize>;

/// A loaded model that can be run repeatedly.
pub trait Runtime {
    /// Runtime name for reports (`tract`, `ort-cpu`, `ort-cuda`).
    fn name(&self) -> &str;
    /// Runs the model; inputs are matched by name, outputs come back in graph order.
    fn run(&mut self, inputs: &[NamedTensor]) -> Result<Vec<NamedTensor>>;
    /// Ends profiling and returns how many nodes ran on each execution provider during
    /// the runs so far; `None` when the runtime has no such notion or profiling is off.
    /// Later runs are not profiled.
    fn placement(&mut self) -> Result<Option<Placement>> {
        Ok(None)
    }
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
