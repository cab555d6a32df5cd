//! A decoding model loaded on one runtime, apart from any decoder's state (as
//! onnxruntime-genai keeps one `Model` of sessions apart from each generator's `State`):
//! opened once per command and runtime, then lent to each decoder over it
//! ([`Decoder::new`](crate::generation::Decoder::new)), one at a time. What it runs on is
//! one [`Engine`]: a runtime of runs (the state carried from run to run, or the prefix
//! re-run), or a session of bound buffers running the file with its step graph's outputs
//! (a static state written in place, bound.rs).

use crate::error::{one_line, Error, Result};
use crate::generation::model::DecodingModel;
use crate::generation::step_graph::step_graph;
use crate::runtime::{
    open, open_bound, BoundSession, ModelFile, ModelSource, Runtime, RuntimeKind, RuntimeOptions,
};

/// Where a static-state model's runs write its state ([`LoadedModel::open`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateWrites {
    /// In buffers bound once, written in place by each run where the runtime and the file
    /// allow it (the default).
    InPlace,
    /// A new state every run, copied as a plain loop over the file does (to measure what
    /// writing in place saves).
    Copied,
}

/// What a loaded model runs on.
pub(crate) enum Engine {
    /// A runtime of runs: the state carried from run to run, or the prefix re-run.
    Runs(Box<dyn Runtime>),
    /// A session of bound buffers: the static state written in place.
    Bound {
        /// The session, running the file with its step graph's outputs.
        session: Box<dyn BoundSession>,
        /// What opening changed from what was asked (CUDA graphs refused).
        open_note: Option<String>,
    },
}

impl Engine {
    /// The runtime of runs, for the state forms that run on one.
    pub(crate) fn runs(&mut self) -> Result<&mut dyn Runtime> {
        match self {
            Engine::Runs(runtime) => Ok(runtime.as_mut()),
            Engine::Bound { .. } => Err(Error::Internal(
                "a carried state over a session of bound buffers".into(),
            )),
        }
    }

    /// The session of bound buffers, for the bound state.
    pub(crate) fn session(&mut self) -> Result<&mut dyn BoundSession> {
        match self {
            Engine::Bound { session, .. } => Ok(session.as_mut()),
            Engine::Runs(_) => Err(Error::Internal(
                "a bound state over a runtime of runs".into(),
            )),
        }
    }
}

/// A decoding model loaded on one runtime (see the module documentation).
pub struct LoadedModel {
    description: DecodingModel,
    engine: Engine,
}

impl LoadedModel {
    /// Loads `file` (described by `description`) in `kind`: where the runtime binds
    /// buffers and the graph updates its static state in place, as a session of bound
    /// buffers (unless `writes` is [`StateWrites::Copied`]); otherwise as a runtime of runs.
    /// On ort-cuda a bound session's steps are CUDA graphs: every node of such a graph
    /// runs on the GPU (docs/static-state.md); if ONNX Runtime refuses them, the session
    /// opens without them and [`LoadedModel::note`] says why. The file is decoded here
    /// only if the caller has not.
    pub fn open(
        kind: RuntimeKind,
        file: ModelFile,
        description: DecodingModel,
        options: &RuntimeOptions,
        writes: StateWrites,
    ) -> Result<LoadedModel> {
        let engine = if writes == StateWrites::InPlace && binds(kind, &description) {
            file.with_decoded(|file| open_session(kind, file, options))?
        } else {
            Engine::Runs(open(kind, file, options)?)
        };
        Ok(LoadedModel {
            description,
            engine,
        })
    }

    /// The model of `runtime`, of `kind`, already loaded from `file` (described by
    /// `description`) with `options`: kept where it runs the model as the decoder needs;
    /// where the state is bound instead, `runtime` is dropped (one copy of the weights at a
    /// time) and the file opened again with its step graph's outputs.
    pub fn over(
        runtime: Box<dyn Runtime>,
        kind: RuntimeKind,
        file: ModelFile,
        description: DecodingModel,
        options: &RuntimeOptions,
    ) -> Result<LoadedModel> {
        if !binds(kind, &description) {
            return Ok(LoadedModel {
                description,
                engine: Engine::Runs(runtime),
            });
        }
        drop(runtime);
        LoadedModel::open(kind, file, description, options, StateWrites::InPlace)
    }

    /// The model's decoding description.
    pub fn description(&self) -> &DecodingModel {
        &self.description
    }

    /// Whether decoders write the state in place (a static state in bound buffers).
    pub fn binds_state(&self) -> bool {
        matches!(self.engine, Engine::Bound { .. })
    }

    /// The runtime's name.
    pub fn runtime_name(&self) -> &str {
        match &self.engine {
            Engine::Runs(runtime) => runtime.name(),
            Engine::Bound { session, .. } => session.name(),
        }
    }

    /// What the runtime does differently from running the file as it is for `batch`
    /// sequences (tract's dequantized nodes; CUDA graphs, or why they are off).
    pub fn note(&self, batch: usize) -> Option<String> {
        match &self.engine {
            Engine::Runs(runtime) => runtime.note(),
            Engine::Bound { session, open_note } => {
                let graphs = session.captures().then(|| {
                    format!(
                        "state, ids, positions and logits on the device; each step of {batch} sequences replays a CUDA graph that also picks the greedy tokens"
                    )
                });
                let notes: Vec<String> = graphs.into_iter().chain(open_note.clone()).collect();
                (!notes.is_empty()).then(|| notes.join("; "))
            }
        }
    }

    /// The description and the engine, apart (a decoder reads one and runs the other).
    pub(crate) fn parts(&mut self) -> (&DecodingModel, &mut Engine) {
        (&self.description, &mut self.engine)
    }
}

/// Whether `description`'s state is bound in place on `kind`: a static state the graph
/// updates in place, on a runtime that binds buffers.
fn binds(kind: RuntimeKind, description: &DecodingModel) -> bool {
    description.in_place && kind.binds_buffers()
}

/// The session of bound buffers running the decoded `file` with its step graph's outputs,
/// with CUDA graphs on ort-cuda where ONNX Runtime takes them.
fn open_session(kind: RuntimeKind, file: ModelFile, options: &RuntimeOptions) -> Result<Engine> {
    let bytes = step_graph(file)?;
    let source = ModelSource::Edited {
        path: file.path,
        bytes: &bytes,
    };
    let mut graphs = options.clone();
    graphs.cuda.graphs = kind == RuntimeKind::OrtCuda;
    let (session, open_note) = match open_bound(kind, source, &graphs) {
        Ok(session) => (session, None),
        Err(e) if graphs.cuda.graphs => (
            open_bound(kind, source, options)?,
            Some(format!("CUDA graphs off: {}", one_line(&e))),
        ),
        Err(e) => return Err(e),
    };
    Ok(Engine::Bound { session, open_note })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeSet;
    use std::rc::Rc;

    use super::*;
    use crate::generation::{Decoder, Generator, Sampling};
    use crate::gmlp::SequenceMode;
    use crate::runtime::testing::write_tiny;
    use crate::runtime::{BindingId, BufferId, Element, Replay};

    /// The buffers and bindings alive in a [`Counting`] session.
    #[derive(Default)]
    struct Alive {
        buffers: BTreeSet<BufferId>,
        bindings: BTreeSet<BindingId>,
    }

    /// A session that keeps count of the buffers and bindings alive in the one it wraps.
    struct Counting {
        inner: Box<dyn BoundSession>,
        alive: Rc<RefCell<Alive>>,
    }

    impl BoundSession for Counting {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn captures(&self) -> bool {
            self.inner.captures()
        }
        fn buffer(&mut self, element: Element, shape: &[usize]) -> Result<BufferId> {
            let id = self.inner.buffer(element, shape)?;
            self.alive.borrow_mut().buffers.insert(id);
            Ok(id)
        }
        fn release(&mut self, buffer: BufferId) {
            self.alive.borrow_mut().buffers.remove(&buffer);
            self.inner.release(buffer)
        }
        fn bind(
            &mut self,
            inputs: &[(&str, BufferId)],
            outputs: &[(&str, BufferId)],
            replay: Replay,
        ) -> Result<BindingId> {
            let id = self.inner.bind(inputs, outputs, replay)?;
            self.alive.borrow_mut().bindings.insert(id);
            Ok(id)
        }
        fn unbind(&mut self, binding: BindingId) {
            self.alive.borrow_mut().bindings.remove(&binding);
            self.inner.unbind(binding)
        }
        fn run(&mut self, binding: BindingId) -> Result<()> {
            self.inner.run(binding)
        }
        fn write_i64(&mut self, buffer: BufferId, values: &[i64]) -> Result<()> {
            self.inner.write_i64(buffer, values)
        }
        fn read_i64(&self, buffer: BufferId, offset: usize, out: &mut [i64]) -> Result<()> {
            self.inner.read_i64(buffer, offset, out)
        }
        fn read_f32(&self, buffer: BufferId, offset: usize, out: &mut [f32]) -> Result<()> {
            self.inner.read_f32(buffer, offset, out)
        }
        fn zero(&mut self, buffer: BufferId) -> Result<()> {
            self.inner.zero(buffer)
        }
    }

    /// The greedy tokens of `prompts` (6 each) by a decoder over `model`.
    fn greedy(model: &mut LoadedModel, prompts: &[Vec<i64>]) -> Vec<Vec<i64>> {
        let decoder = Decoder::new(model, prompts.len()).unwrap();
        Generator::new(decoder, Sampling::GREEDY)
            .unwrap()
            .generate(prompts, 6, &mut |_| {})
            .unwrap()
            .tokens
    }

    /// One loaded model serves decoders of different batches one after the other, each
    /// generating what a decoder over a model of its own generates; a bound session gets
    /// back every buffer and binding a dropped decoder made.
    #[test]
    fn one_loaded_model_serves_decoders_one_after_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_tiny(dir.path(), SequenceMode::Static);
        let options = RuntimeOptions::default();
        let prompts = [vec![3i64, 17, 5], vec![40, 2, 9, 11, 1]];
        let mut kinds = vec![RuntimeKind::Tract];
        if cfg!(feature = "test-onnxruntime") {
            kinds.push(RuntimeKind::OrtCpu);
        }
        for kind in kinds {
            let alone: Vec<Vec<i64>> = prompts
                .iter()
                .map(|p| {
                    let decoder = Decoder::open(kind, &path, &options, 1).unwrap();
                    let mut g = Generator::new(decoder, Sampling::GREEDY).unwrap();
                    let mut tokens = g
                        .generate(std::slice::from_ref(p), 6, &mut |_| {})
                        .unwrap()
                        .tokens;
                    tokens.remove(0)
                })
                .collect();
            let distinct: BTreeSet<&i64> = alone.iter().flatten().collect();
            assert!(distinct.len() >= 3, "continuations that vary: {alone:?}");
            let description = DecodingModel::read(&path).unwrap();
            let file = ModelFile::from(&path);
            let opened =
                LoadedModel::open(kind, file, description, &options, StateWrites::InPlace).unwrap();
            assert_eq!(opened.binds_state(), kind.binds_buffers(), "{kind:?}");
            let alive = Rc::new(RefCell::new(Alive::default()));
            let LoadedModel {
                description,
                engine,
            } = opened;
            let engine = match engine {
                Engine::Bound { session, open_note } => Engine::Bound {
                    session: Box::new(Counting {
                        inner: session,
                        alive: alive.clone(),
                    }),
                    open_note,
                },
                runs => runs,
            };
            let mut model = LoadedModel {
                description,
                engine,
            };
            assert_eq!(greedy(&mut model, &prompts), alone, "{kind:?} together");
            assert_eq!(
                greedy(&mut model, &prompts[1..]),
                alone[1..],
                "{kind:?} one"
            );
            assert_eq!(
                greedy(&mut model, &prompts[..1]),
                alone[..1],
                "{kind:?} other"
            );
            let decoder = Decoder::new(&mut model, 2).unwrap();
            let made = alive.borrow().buffers.len();
            drop(decoder);
            let alive = alive.borrow();
            // A bound state: 1 buffer per state tensor, 5 of the step, 2 step bindings.
            let state = model.description().info.state.len();
            if model.binds_state() {
                assert_eq!(made, state + 5, "{kind:?}");
            }
            assert!(alive.buffers.is_empty(), "{kind:?}: {:?}", alive.buffers);
            assert!(alive.bindings.is_empty(), "{kind:?}: {:?}", alive.bindings);
        }
    }
}
