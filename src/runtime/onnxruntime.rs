//! ONNX Runtime through `ort` with `load-dynamic`: the shared library is the one PyPI's
//! `onnxruntime` (CPU) or `onnxruntime-gpu` (CUDA 13, cuDNN 9) wheel ships, found from an
//! explicit path, `ORT_DYLIB_PATH`, or a Python environment's `onnxruntime` package (see
//! [`discovery`](crate::runtime::discovery) for the order).
//!
//! The CUDA execution provider is registered with `error_on_failure`, so a machine
//! without CUDA gets an error instead of `ort`'s silent fallback to the CPU, and with
//! TF32 off unless asked for (the CUDA EP enables it by default, which breaks f32 parity).

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ort::environment::Environment;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, TensorRef};

use crate::error::{contain_panic, one_line, Error, Remedy, Result};
use crate::runtime::discovery::{discover, SearchContext};
use crate::runtime::{
    missing_output, CarriedState, Carry, DeviceRun, ModelSource, Placement, Runtime, RuntimeKind,
    RuntimeOptions, StateValue,
};
use crate::tensor::{with_array, NamedTensor, TensorValue};

mod io_binding;
// The runtime layer's only `unsafe` (runtime/mod.rs denies it elsewhere).
#[allow(unsafe_code)]
mod buffer;
mod outputs;

pub(crate) use io_binding::OrtBound;

/// The ONNX Runtime version this build is written against (`ort` feature `api-31`).
pub const REQUIRED_ORT: &str = "1.31";

/// How to get the library, for error messages (naming the file is their
/// [`Remedy::OrtLibrary`]).
pub const HOW_TO_GET: &str = "install it with `pip install onnxruntime==1.31.1` into the active \
    virtual environment or the one gmlp-onnx is installed in, or set ORT_DYLIB_PATH to its \
    onnxruntime/capi/libonnxruntime.so.1.31.1";

/// Finds `libonnxruntime.so` in the order of [`discovery`](crate::runtime::discovery): `explicit` (`--ort-lib`),
/// `ORT_DYLIB_PATH`, `$VIRTUAL_ENV`, the environment this binary is installed in,
/// `./.venv`, then the `onnxruntime` package of `$GMLP_ONNX_PYTHON` or `python3`. The
/// error, for the runtime `kind` that asked, lists every place looked at.
pub fn find_library(explicit: Option<&Path>, kind: RuntimeKind) -> Result<PathBuf> {
    let found = discover(&SearchContext::from_process(explicit));
    match found.found() {
        Some((_, library)) => Ok(library.to_path_buf()),
        None => Err(Error::RuntimeUnavailable {
            runtime: kind.name(),
            reason: if found.explicit_choice_failed() {
                format!("{}; {HOW_TO_GET}", found.summary())
            } else {
                format!(
                    "libonnxruntime.so not found; looked at {}; {HOW_TO_GET}",
                    found.summary()
                )
            },
            remedy: Some(Remedy::OrtLibrary),
        }),
    }
}

/// The process's ONNX Runtime environment: `ort` allows one per process, ever, so it is
/// created on first use and kept, together with the library it was loaded from.
static ENVIRONMENT: Mutex<Option<(PathBuf, Environment)>> = Mutex::new(None);

/// The environment of `library` (loaded on first use), or why it cannot be loaded, for the
/// runtime `kind` that asked.
fn environment_for(library: &Path, kind: RuntimeKind) -> Result<Environment> {
    let unavailable = |reason: String| Error::RuntimeUnavailable {
        runtime: kind.name(),
        reason,
        remedy: Some(Remedy::OrtLibrary),
    };
    let mut slot = ENVIRONMENT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((loaded, env)) = slot.as_ref() {
        return if loaded == library {
            Ok(env.clone())
        } else {
            Err(unavailable(format!(
                "{} is already loaded in this process; cannot also load {}",
                loaded.display(),
                library.display()
            )))
        };
    }
    let env = ort::init_from(library)
        .map_err(|e| {
            format!(
                "cannot load {} ({}); this build needs ONNX Runtime {REQUIRED_ORT}.x; {HOW_TO_GET}",
                library.display(),
                one_line(e)
            )
        })
        .map_err(unavailable)?
        .with_name("gmlp-onnx")
        .build()
        .map_err(|e| unavailable(one_line(e)))?;
    *slot = Some((library.to_path_buf(), env.clone()));
    Ok(env)
}

/// Loads `library` (once per process) and returns ONNX Runtime's build information
/// (`ORT Build Info: git-branch=rel-1.31.1, ...`), or why it cannot be loaded (an error of
/// ort-cpu, the runtime the library alone makes).
pub fn build_info(library: &Path) -> Result<String> {
    environment_for(library, RuntimeKind::OrtCpu)?;
    Ok(one_line(ort::info()))
}

/// Where an ONNX Runtime session runs, with what only that place has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// The CPU execution provider (ort-cpu).
    Cpu,
    /// The CUDA execution provider (ort-cuda): outputs computed in the memory of CUDA
    /// device `device`, with CUDA graphs where `graphs`
    /// ([`CudaOptions::graphs`](crate::runtime::CudaOptions::graphs)).
    Cuda {
        /// CUDA device ordinal ([`CudaOptions::device`](crate::runtime::CudaOptions::device)).
        device: i32,
        /// CUDA graphs enabled.
        graphs: bool,
    },
}

impl Provider {
    /// The provider of the runtime `kind` with `options`' CUDA settings; `None` for a
    /// runtime that is not ONNX Runtime.
    pub fn of(kind: RuntimeKind, options: &RuntimeOptions) -> Option<Provider> {
        match kind {
            RuntimeKind::Tract => None,
            RuntimeKind::OrtCpu => Some(Provider::Cpu),
            RuntimeKind::OrtCuda => Some(Provider::Cuda {
                device: options.cuda.device,
                graphs: options.cuda.graphs,
            }),
        }
    }

    /// The runtime this provider is.
    pub fn kind(self) -> RuntimeKind {
        match self {
            Provider::Cpu => RuntimeKind::OrtCpu,
            Provider::Cuda { .. } => RuntimeKind::OrtCuda,
        }
    }

    /// The runtime's name ([`RuntimeKind::name`]), for messages.
    fn name(self) -> &'static str {
        match self {
            Provider::Cpu => "ort-cpu",
            Provider::Cuda { .. } => "ort-cuda",
        }
    }
}

/// A model loaded in ONNX Runtime.
pub struct OrtRuntime {
    session: Session,
    provider: Provider,
    /// The runtime's name ([`Provider::name`]).
    name: &'static str,
    /// What the last run on the CPU saw, for [`Runtime::run_into`]'s bound outputs.
    shapes: Option<outputs::RunShapes>,
    profiling: bool,
    _environment: Environment,
}

/// ONNX Runtime's session option naming the folder of the external data files of a model
/// loaded from memory (`kOrtSessionOptionsModelExternalInitializersFileFolderPath`).
const EXTERNAL_DATA_FOLDER: &str = "session.model_external_initializers_file_folder_path";

/// Counts, per execution provider, the distinct graph nodes that ran in an ONNX Runtime
/// profile (the Chrome-trace JSON written by `end_profiling`): events with
/// `"cat": "Node"` carry `args.provider` and `args.op_name`. A node run several times is
/// counted once. Errors name the runtime `kind` that wrote it.
pub fn parse_profile(kind: RuntimeKind, text: &str) -> Result<Placement> {
    let bad = |reason: String| Error::RuntimeFailed {
        runtime: kind.name(),
        reason: format!("cannot read the ONNX Runtime profile: {reason}"),
    };
    let events: Vec<serde_json::Value> =
        serde_json::from_str(text).map_err(|e| bad(one_line(e)))?;
    let mut seen = std::collections::BTreeSet::new();
    let mut placement = Placement::new();
    for event in &events {
        if event.get("cat").and_then(|c| c.as_str()) != Some("Node") {
            continue;
        }
        let args = event.get("args");
        let field = |k: &str| args.and_then(|a| a.get(k)).and_then(|v| v.as_str());
        let (Some(provider), Some(_op)) = (field("provider"), field("op_name")) else {
            continue;
        };
        let node = (
            event.get("name").and_then(|n| n.as_str()).unwrap_or(""),
            field("node_index").unwrap_or(""),
            provider,
        );
        if seen.insert(node) {
            *placement.entry(provider.to_string()).or_insert(0) += 1;
        }
    }
    Ok(placement)
}

/// Whether ONNX Runtime's session-creation error is its refusal to place nodes on the CPU
/// after `with_disable_cpu_fallback` (ONNX Runtime 1.31 wording). This branch on its words
/// stays: the placement is decided inside session creation (no check before it can know),
/// its code is `ORT_FAIL` like any failure there, and telling it apart otherwise would
/// take creating the session (on the GPU) a second time with the fallback on.
fn refused_cpu_fallback(message: &str) -> bool {
    message.contains("fallback to CPU EP has been explicitly disabled")
}

fn failed(runtime: &str, e: impl std::fmt::Display) -> Error {
    Error::RuntimeFailed {
        runtime: runtime.into(),
        reason: one_line(e),
    }
}

impl OrtRuntime {
    /// Loads `model` on `provider` (the rest of `options` as they apply to it).
    pub fn load(model: &Path, provider: Provider, options: &RuntimeOptions) -> Result<Self> {
        OrtRuntime::load_from(ModelSource::File(model), provider, options)
    }

    /// [`OrtRuntime::load`] of the file or of an edited copy of it.
    pub(crate) fn load_from(
        source: ModelSource,
        provider: Provider,
        options: &RuntimeOptions,
    ) -> Result<Self> {
        let name = provider.name();
        let kind = provider.kind();
        let library = find_library(options.ort.library.as_deref(), kind)?;
        let unavailable = |reason: String| Error::RuntimeUnavailable {
            runtime: name.into(),
            reason,
            remedy: None,
        };
        let environment = environment_for(&library, kind)?;
        // ONNX Runtime's own log would print failures over several lines; they come
        // back as errors and are reported on one line instead.
        let mut builder = Session::builder(&environment)
            .map_err(|e| failed(name, e))?
            .with_log_level(ort::logging::LogLevel::Fatal)
            .map_err(|e| failed(name, e))?;
        if options.ort.threads > 0 {
            builder = builder
                .with_intra_threads(options.ort.threads)
                .map_err(|e| failed(name, e))?;
        }
        if let Some(prefix) = &options.ort.profile_prefix {
            builder = builder
                .with_profiling(prefix)
                .map_err(|e| failed(name, e))?;
        }
        if let Provider::Cuda { device, graphs } = provider {
            if options.cuda.no_cpu_fallback {
                builder = builder
                    .with_disable_cpu_fallback()
                    .map_err(|e| failed(name, e))?;
            }
            builder = register_cuda(builder, device, options.cuda.tf32, graphs)?;
        }
        let committed = match &source {
            ModelSource::File(path) => builder.commit_from_file(path),
            ModelSource::Edited { path, bytes } => {
                let folder = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                let folder = folder.to_str().ok_or_else(|| {
                    Error::Unsupported(format!(
                        "the folder of {} is not UTF-8, which ONNX Runtime needs to find its external data",
                        path.display()
                    ))
                })?;
                builder
                    .with_config_entry(EXTERNAL_DATA_FOLDER, folder)
                    .map_err(|e| failed(name, e))?
                    .commit_from_memory(bytes)
            }
        };
        let session = committed.map_err(|e| {
            let message = e.to_string();
            if kind == RuntimeKind::OrtCuda && refused_cpu_fallback(&message) {
                // Not the input's fault: CUDA cannot run the whole graph (exit 3, like a
                // missing CUDA), e.g. the shape computations of a with-past graph, which
                // ONNX Runtime keeps on the CPU, or DynamicQuantizeLinear of int8 models.
                unavailable(format!(
                    "some nodes have no CUDA placement and the CPU fallback is off ({})",
                    one_line(message)
                ))
            } else {
                failed(name, message)
            }
        })?;
        Ok(OrtRuntime {
            session,
            provider,
            name,
            shapes: None,
            profiling: options.ort.profile_prefix.is_some(),
            _environment: environment,
        })
    }
}

#[cfg(feature = "cuda")]
fn register_cuda(
    builder: ort::session::builder::SessionBuilder,
    device: i32,
    tf32: bool,
    graphs: bool,
) -> Result<ort::session::builder::SessionBuilder> {
    let provider = ort::ep::CUDA::default()
        .with_device_id(device)
        .with_tf32(tf32)
        .with_cuda_graph(graphs)
        .build()
        .error_on_failure();
    builder.with_execution_providers([provider]).map_err(|e| Error::RuntimeUnavailable {
        runtime: RuntimeKind::OrtCuda.name(),
        reason: format!(
            "the CUDA execution provider could not be registered on CUDA device {device} ({}); ort-cuda \
             needs that device (nvidia-smi lists them, from 0) with its driver, the libonnxruntime.so of PyPI's onnxruntime-gpu 1.31 \
             and the CUDA 13 / cuDNN 9 libraries (pip install onnxruntime-gpu==1.31.1 nvidia-cuda-runtime \
             nvidia-cublas nvidia-cufft nvidia-curand nvidia-cudnn-cu13)",
            one_line(e)
        ),
        remedy: Some(Remedy::OrtLibrary),
    })
}

#[cfg(not(feature = "cuda"))]
fn register_cuda(
    _builder: ort::session::builder::SessionBuilder,
    _device: i32,
    _tf32: bool,
    _graphs: bool,
) -> Result<ort::session::builder::SessionBuilder> {
    Err(Error::RuntimeUnavailable {
        runtime: RuntimeKind::OrtCuda.name(),
        reason: "this gmlp-onnx was built without the `cuda` cargo feature, so the CUDA execution \
                 provider cannot be registered"
            .into(),
        remedy: None,
    })
}

impl Drop for OrtRuntime {
    /// A session dropped while still profiling (e.g. after a failed run) ends the
    /// profile and removes its file, so nothing is left in the temp directory.
    fn drop(&mut self) {
        if self.profiling {
            if let Ok(file) = self.session.end_profiling() {
                if !file.is_empty() {
                    let _ = std::fs::remove_file(file);
                }
            }
        }
    }
}

impl Runtime for OrtRuntime {
    fn name(&self) -> &str {
        self.name
    }

    fn placement(&mut self) -> Result<Option<Placement>> {
        if !self.profiling {
            return Ok(None);
        }
        self.profiling = false;
        let file = PathBuf::from(
            self.session
                .end_profiling()
                .map_err(|e| failed(self.name, e))?,
        );
        let text = std::fs::read_to_string(&file);
        let _ = std::fs::remove_file(&file);
        let text = text.map_err(|e| Error::io(&file, e))?;
        parse_profile(self.provider.kind(), &text).map(Some)
    }

    fn run(&mut self, inputs: &[NamedTensor]) -> Result<Vec<NamedTensor>> {
        let mut outputs = Vec::new();
        self.run_into(inputs, &mut outputs)?;
        Ok(outputs)
    }

    fn run_into(&mut self, inputs: &[NamedTensor], outputs: &mut Vec<NamedTensor>) -> Result<()> {
        let name = self.name;
        contain_panic(name, || self.run_into_unguarded(inputs, outputs))
    }

    fn on_device<'a>(
        &'a mut self,
        inputs: &[NamedTensor],
    ) -> Result<Option<Box<dyn DeviceRun + 'a>>> {
        let name = self.name;
        contain_panic(name, move || self.on_device_unguarded(inputs))
    }

    fn run_carrying(
        &mut self,
        inputs: &[NamedTensor],
        state: &mut CarriedState,
        carry: &[Carry],
    ) -> Result<Vec<NamedTensor>> {
        let name = self.name;
        contain_panic(name, || self.run_carrying_unguarded(inputs, state, carry))
    }
}

/// A host array as an input view (no copy).
fn host_input<'a>(name: &str, value: &'a TensorValue) -> Result<SessionInputValue<'a>> {
    Ok(with_array!(value, a => TensorRef::from_array_view(a.view())
        .map_err(|e| failed(name, e))?
        .into()))
}

/// Copies an output value into a host array of the types compared.
fn host_value(name: &str, out_name: &str, v: &DynValue) -> Result<TensorValue> {
    Ok(if let Ok(a) = v.try_extract_array::<f32>() {
        TensorValue::F32(a.to_owned())
    } else if let Ok(a) = v.try_extract_array::<f64>() {
        TensorValue::F64(a.to_owned())
    } else if let Ok(a) = v.try_extract_array::<i32>() {
        TensorValue::I32(a.to_owned())
    } else if let Ok(a) = v.try_extract_array::<i64>() {
        TensorValue::I64(a.to_owned())
    } else {
        return Err(failed(
            name,
            format!(
                "output {out_name} is not float32, float64, int32 or int64, the types compared"
            ),
        ));
    })
}

/// An output value of an ONNX Runtime session, kept as the session made it (on the
/// device for ort-cuda) to be fed back as an input ([`StateValue::Ort`]).
pub struct OrtValue {
    value: DynValue,
    /// The runtime that made it, for messages.
    runtime: &'static str,
}

impl OrtValue {
    /// A host copy of the value.
    pub fn to_host(&self) -> Result<TensorValue> {
        host_value(self.runtime, "state", &self.value)
    }
}

impl OrtRuntime {
    /// Feeds `inputs` and `state` by name; outputs in `carry` become the next state as
    /// ONNX Runtime's own values (no copy), the others come back as host arrays.
    fn run_carrying_unguarded(
        &mut self,
        inputs: &[NamedTensor],
        state: &mut CarriedState,
        carry: &[Carry],
    ) -> Result<Vec<NamedTensor>> {
        let name = self.name;
        let mut feed: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = Vec::new();
        for outlet in self.session.inputs() {
            let wanted = outlet.name();
            let value = if let Some(t) = inputs.iter().find(|t| t.name == wanted) {
                host_input(name, &t.value)?
            } else if let Some((_, v)) = state.values.iter().find(|(n, _)| n == wanted) {
                match v {
                    StateValue::Host(t) => host_input(name, t)?,
                    StateValue::Ort(v) => (&v.value).into(),
                    // A state is carried by the runtime that made it.
                    StateValue::Tract(_) | StateValue::Spent => {
                        return Err(Error::Internal(format!(
                            "{wanted}: a value of tract's fed to ONNX Runtime"
                        )))
                    }
                }
            } else {
                return Err(Error::BadTensor(format!(
                    "no value given for model input {wanted}"
                )));
            };
            feed.push((Cow::Owned(wanted.to_string()), value));
        }
        let output_names: Vec<String> = self
            .session
            .outputs()
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        let mut outputs = self.session.run(feed).map_err(|e| failed(name, e))?;
        let mut kept = Vec::with_capacity(carry.len());
        for pair in carry {
            let v = outputs
                .remove(pair.output.as_str())
                .ok_or_else(|| missing_output(name, &pair.output))?;
            kept.push((
                pair.input.clone(),
                StateValue::Ort(OrtValue {
                    value: v,
                    runtime: name,
                }),
            ));
        }
        let rest = output_names
            .iter()
            .filter(|n| !carry.iter().any(|pair| pair.output == **n))
            .map(|out_name| {
                let v = outputs.get(out_name.as_str()).ok_or_else(|| {
                    failed(name, format!("the run returned no output named {out_name}"))
                })?;
                Ok(NamedTensor {
                    name: out_name.clone(),
                    value: host_value(name, out_name, v)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if !carry.is_empty() {
            state.values = kept;
        }
        Ok(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::{refused_cpu_fallback, Provider};
    use crate::runtime::{RuntimeKind, RuntimeOptions};

    #[test]
    fn each_provider_is_one_runtime_named_as_users_spell_it() {
        let options = RuntimeOptions {
            cuda: crate::runtime::CudaOptions {
                device: 2,
                graphs: true,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(Provider::of(RuntimeKind::Tract, &options), None);
        for kind in [RuntimeKind::OrtCpu, RuntimeKind::OrtCuda] {
            let provider = Provider::of(kind, &options).unwrap();
            assert_eq!(provider.kind(), kind);
            assert_eq!(provider.name(), kind.name());
        }
        assert_eq!(
            Provider::of(RuntimeKind::OrtCuda, &options),
            Some(Provider::Cuda {
                device: 2,
                graphs: true
            })
        );
    }

    #[test]
    fn the_cpu_fallback_refusal_is_recognized_by_its_wording() {
        // ONNX Runtime 1.31.1's message on an H100 for a with-past graph (bench/gpu_leg.sh).
        let seen = "This session contains graph nodes that are assigned to the default CPU EP, but fallback to CPU EP has been explicitly disabled by the user.";
        assert!(refused_cpu_fallback(seen));
        assert!(!refused_cpu_fallback(
            "Load model from m.onnx failed: Protobuf parsing failed."
        ));
    }
}
