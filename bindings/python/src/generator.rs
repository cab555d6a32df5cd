//! `Generator`: one loaded causal token model and the library's one generation loop over
//! it, driven a step at a time. Each step runs with the GIL released and the loop returns
//! to Python between steps (signals are checked there, so Ctrl-C raises
//! `KeyboardInterrupt` and the generator stays usable: the next call starts afresh); the
//! model and its decoder live behind a mutex taken only with the GIL released, so two
//! generators run at once in two threads and one generator used from two threads takes
//! turns.

use std::path::PathBuf;
use std::sync::Mutex;

use clap::Parser;
use gmlp_onnx::generation::StepForm;
use gmlp_onnx::generation::{
    check_vocabulary, Decoder, DecodingFile, LoadedModel, Run, Sampling, StateWrites,
};
use gmlp_onnx::runtime::RuntimeKind;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::cli::flags::OrtFlags;
use crate::errors::detached;

/// ONNX Runtime's library, threads and device, as the generate command's flags.
#[derive(Parser)]
struct Runtime {
    #[command(flatten)]
    ort: OrtFlags,
}

/// The loaded model: without a decoder, or inside the generator of the last batch size.
enum Loaded {
    Idle(Box<LoadedModel>),
    Decoding(Box<gmlp_onnx::generation::Generator<'static>>),
    /// Lost to a failure that could not give the model back.
    Gone,
}

/// What the mutex guards.
struct Session {
    loaded: Loaded,
    /// The generation between `start` and its last `step`.
    run: Option<Run>,
}

impl Session {
    /// The generator of `batch` sequences over the loaded model (made anew when the batch
    /// size changes), picking as `sampling` says and stopping at `end_token` (the file's
    /// own when `None`).
    fn generator(
        &mut self,
        batch: usize,
        sampling: Sampling,
        end_token: Option<i64>,
    ) -> anyhow::Result<&mut gmlp_onnx::generation::Generator<'static>> {
        self.run = None;
        let loaded = std::mem::replace(&mut self.loaded, Loaded::Gone);
        let generator = match loaded {
            Loaded::Decoding(g) if g.batch() == batch => g,
            Loaded::Decoding(g) => {
                let model = (*g).into_decoder().into_model().ok_or_else(|| {
                    gmlp_onnx::Error::Internal("a generator over a lent model".into())
                })?;
                self.new_generator(model, batch)?
            }
            Loaded::Idle(model) => self.new_generator(model, batch)?,
            Loaded::Gone => anyhow::bail!(gmlp_onnx::Error::Internal(
                "this generator lost its model to an earlier failure; make a new one".into()
            )),
        };
        self.loaded = Loaded::Decoding(generator);
        let Loaded::Decoding(g) = &mut self.loaded else {
            unreachable!("just set")
        };
        g.set_sampling(sampling)?;
        let end = match end_token {
            Some(id) => Some(id),
            None => g.model_end_token(),
        };
        g.set_end_token(end)?;
        Ok(g)
    }

    fn new_generator(
        &mut self,
        model: Box<LoadedModel>,
        batch: usize,
    ) -> anyhow::Result<Box<gmlp_onnx::generation::Generator<'static>>> {
        match Decoder::owning(model, batch) {
            Ok(decoder) => Ok(Box::new(gmlp_onnx::generation::Generator::new(
                decoder,
                Sampling::GREEDY,
            )?)),
            Err(failed) => {
                let (e, model) = *failed;
                self.loaded = Loaded::Idle(model);
                Err(e.into())
            }
        }
    }
}

/// A causal token model loaded once for generating (`gmlp_onnx.Generator` wraps it).
#[pyclass(module = "gmlp_onnx._native")]
pub struct Generator {
    session: Mutex<Session>,
    runtime: String,
    vocab_size: usize,
    max_sequence: usize,
    eos_token_id: Option<i64>,
    note: Option<String>,
    step_form: Option<&'static str>,
}

/// The sampling of a Python call: `{"temperature", "top_k", "top_p", "seed"}`.
fn sampling_of(d: &Bound<'_, PyDict>) -> PyResult<Sampling> {
    let get = |k: &str| d.get_item(k).ok().flatten().filter(|v| !v.is_none());
    Ok(Sampling {
        temperature: get("temperature").map(|v| v.extract()).transpose()?,
        top_k: get("top_k").map(|v| v.extract()).transpose()?,
        top_p: get("top_p").map(|v| v.extract()).transpose()?,
        seed: get("seed").map(|v| v.extract()).transpose()?.unwrap_or(0),
    })
}

#[pymethods]
impl Generator {
    /// Loads `path` in `runtime` (`tract`, `ort-cpu`, `ort-cuda`), with the generate
    /// command's runtime flags as keywords in `options` (`ort_lib`, `threads`, `device`).
    #[new]
    #[pyo3(signature = (path, runtime, options=None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        runtime: &str,
        options: Option<Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let flags: Runtime = crate::options::parse("Generator", &[], options.as_ref(), &[])
            .map_err(|e| e.into_py(py))?;
        let kind = <RuntimeKind as clap::ValueEnum>::from_str(runtime, false).map_err(|_| {
            crate::errors::raise(
                py,
                "InvalidArgumentError",
                format!("runtime {runtime:?} is none of tract, ort-cpu, ort-cuda"),
            )
        })?;
        detached(py, move || {
            let file = DecodingFile::read(&path)?;
            let description = file.description().clone();
            let step_form = StepForm::of(file.decoded()).map(StepForm::name);
            let loaded = file.load(kind, &flags.ort.runtime_options(), StateWrites::InPlace)?;
            let note = loaded.note(1);
            Ok(Generator {
                runtime: loaded.runtime_name().to_string(),
                vocab_size: description.vocab_size,
                max_sequence: description.info.max_sequence,
                eos_token_id: description.end_token,
                note,
                step_form,
                session: Mutex::new(Session {
                    loaded: Loaded::Idle(Box::new(loaded)),
                    run: None,
                }),
            })
        })
    }

    /// The runtime's name.
    #[getter]
    fn runtime(&self) -> &str {
        &self.runtime
    }

    /// The vocabulary size.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Positions of the model (prompt plus new tokens at most).
    #[getter]
    fn max_sequence(&self) -> usize {
        self.max_sequence
    }

    /// The end token the file records.
    #[getter]
    fn eos_token_id(&self) -> Option<i64> {
        self.eos_token_id
    }

    /// What the runtime does differently from running the file as it is.
    #[getter]
    fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// The static step the file runs (`fused`, `portable-fusable`, `portable`; `None`
    /// for other files), as `gmlp-onnx generate --json` names it.
    #[getter]
    fn step_form(&self) -> Option<&'static str> {
        self.step_form
    }

    /// Starts a generation of `prompts` (the prefill runs here) for `step` to advance.
    #[pyo3(signature = (prompts, max_new_tokens, sampling, eos_token_id=None))]
    fn start(
        &self,
        py: Python<'_>,
        prompts: Vec<Vec<i64>>,
        max_new_tokens: usize,
        sampling: Bound<'_, PyDict>,
        eos_token_id: Option<i64>,
    ) -> PyResult<()> {
        let sampling = sampling_of(&sampling)?;
        let vocab = self.vocab_size;
        detached(py, || {
            check_request(&prompts, vocab)?;
            let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
            let run = session
                .generator(prompts.len(), sampling, eos_token_id)?
                .start(&prompts, max_new_tokens)?;
            session.run = Some(run);
            Ok(())
        })
    }

    /// One step of the generation `start` began: each sequence's new token (`None` for one
    /// that has ended), or `None` when it is done.
    fn step(&self, py: Python<'_>) -> PyResult<Option<Vec<Option<i64>>>> {
        detached(py, || {
            let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
            let Session { loaded, run } = &mut *session;
            let (Loaded::Decoding(g), Some(r)) = (loaded, run.as_mut()) else {
                return Ok(None);
            };
            let picks = g.step(r);
            match picks {
                Ok(Some(p)) => Ok(Some(p)),
                Ok(None) => {
                    *run = None;
                    Ok(None)
                }
                Err(e) => {
                    *run = None;
                    Err(e.into())
                }
            }
        })
    }

    /// Generates for `prompts` and returns each one's new tokens: `start`, then `step`
    /// until done, checking for signals (Ctrl-C) between steps.
    #[pyo3(signature = (prompts, max_new_tokens, sampling, eos_token_id=None))]
    fn generate(
        &self,
        py: Python<'_>,
        prompts: Vec<Vec<i64>>,
        max_new_tokens: usize,
        sampling: Bound<'_, PyDict>,
        eos_token_id: Option<i64>,
    ) -> PyResult<Vec<Vec<i64>>> {
        let mut tokens = vec![Vec::new(); prompts.len()];
        self.start(py, prompts, max_new_tokens, sampling, eos_token_id)?;
        loop {
            if let Err(e) = py.check_signals() {
                self.abandon(py);
                return Err(e);
            }
            let Some(picks) = self.step(py)? else {
                return Ok(tokens);
            };
            for (sequence, pick) in tokens.iter_mut().zip(picks) {
                sequence.extend(pick);
            }
        }
    }
}

impl Generator {
    /// Drops the generation in progress (after an interrupt).
    fn abandon(&self, py: Python<'_>) {
        py.detach(|| {
            let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
            session.run = None;
        });
    }
}

/// Refuses an empty batch, an empty prompt or an id outside the vocabulary.
fn check_request(prompts: &[Vec<i64>], vocab: usize) -> anyhow::Result<()> {
    if prompts.is_empty() {
        anyhow::bail!(gmlp_onnx::Error::BatchShape("no prompt".into()));
    }
    if prompts.iter().any(Vec::is_empty) {
        anyhow::bail!(gmlp_onnx::Error::BatchShape("a prompt is empty".into()));
    }
    check_vocabulary(prompts.iter().flatten(), vocab, "prompt token id")?;
    Ok(())
}
