//! Flag groups that several commands share, each defined once and flattened into the
//! commands that take it (`#[command(flatten)]`).

use std::path::PathBuf;

use clap::Args;

use gmlp_onnx::runtime::{CudaOptions, OrtOptions, RuntimeKind, RuntimeOptions, TractOptions};
use gmlp_onnx::validate::{ToleranceError, ToleranceRequest};
use gmlp_onnx::Error;

/// Where ONNX Runtime comes from and how it runs: every command that opens it.
#[derive(Args, Clone, Debug, Default)]
pub struct OrtFlags {
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, else a Python environment's onnxruntime; see `gmlp-onnx doctor`).
    #[arg(long, value_name = "PATH")]
    pub ort_lib: Option<PathBuf>,
    /// Threads of a run: ONNX Runtime's intra-op threads (0: its default, one per physical
    /// core) and tract's matrix products (0: one).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// ort-cuda: the CUDA device to run on (its ordinal, as nvidia-smi numbers them).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub device: i32,
    /// Allow TF32 on the CUDA execution provider (validate: loosens the default rtol to at least 1e-2).
    #[arg(long)]
    pub tf32: bool,
    /// ort-cuda: refuse the model unless every node can be placed on the CUDA execution provider.
    #[arg(long)]
    pub cuda_no_cpu_fallback: bool,
}

/// The runtimes a model is run and compared on: `validate` and `build --validate`.
#[derive(Args, Clone, Debug)]
pub struct RuntimeList {
    /// Comma-separated runtimes.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tract,ort-cpu"
    )]
    pub runtimes: Vec<RuntimeKind>,
}

/// The bounds of a comparison of runtimes: `validate` and `build --validate`.
#[derive(Args, Clone, Debug, Default)]
pub struct ToleranceFlags {
    /// Relative tolerance, scaled by the largest reference magnitude [default: by the model's precision: f32 1e-4, f16 1e-2].
    #[arg(long)]
    pub rtol: Option<f64>,
    /// Absolute tolerance [default: by the model's precision: f32 1e-6, f16 1e-4].
    #[arg(long)]
    pub atol: Option<f64>,
}

impl ToleranceFlags {
    /// Whether either bound is given.
    pub fn given(&self) -> bool {
        self.rtol.is_some() || self.atol.is_some()
    }

    /// The bounds asked for, checked, naming the flag that is wrong.
    pub fn request(&self) -> Result<ToleranceRequest, Error> {
        ToleranceRequest {
            rtol: self.rtol,
            atol: self.atol,
        }
        .check()
        .map_err(|e| {
            let flag = match e {
                ToleranceError::Rtol => "--rtol",
                ToleranceError::Atol => "--atol",
            };
            Error::OutOfRange(format!("{flag} must be a finite number >= 0"))
        })
    }
}

impl OrtFlags {
    /// Runtime options with these flags and the rest at their defaults.
    pub fn runtime_options(&self) -> RuntimeOptions {
        RuntimeOptions {
            tract: TractOptions {
                threads: self.threads,
                ..Default::default()
            },
            ort: OrtOptions {
                library: self.ort_lib.clone(),
                threads: self.threads,
                ..Default::default()
            },
            cuda: CudaOptions {
                device: self.device,
                tf32: self.tf32,
                no_cpu_fallback: self.cuda_no_cpu_fallback,
                ..Default::default()
            },
        }
    }
}
