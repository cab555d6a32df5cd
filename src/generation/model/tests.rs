//! Unit tests of `model` (in their own file: the module itself stays under 600 lines).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

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
    alive: Arc<Mutex<Alive>>,
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
        self.alive.lock().unwrap().buffers.insert(id);
        Ok(id)
    }
    fn release(&mut self, buffer: BufferId) {
        self.alive.lock().unwrap().buffers.remove(&buffer);
        self.inner.release(buffer)
    }
    fn bind(
        &mut self,
        inputs: &[(&str, BufferId)],
        outputs: &[(&str, BufferId)],
        replay: Replay,
    ) -> Result<BindingId> {
        let id = self.inner.bind(inputs, outputs, replay)?;
        self.alive.lock().unwrap().bindings.insert(id);
        Ok(id)
    }
    fn unbind(&mut self, binding: BindingId) {
        self.alive.lock().unwrap().bindings.remove(&binding);
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
        let alive = Arc::new(Mutex::new(Alive::default()));
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
        let made = alive.lock().unwrap().buffers.len();
        drop(decoder);
        let alive = alive.lock().unwrap();
        // A bound state: 1 buffer per state tensor, 5 of the step, 2 step bindings.
        let state = model.description().info.state.len();
        if model.binds_state() {
            assert_eq!(made, state + 5, "{kind:?}");
        }
        assert!(alive.buffers.is_empty(), "{kind:?}: {:?}", alive.buffers);
        assert!(alive.bindings.is_empty(), "{kind:?}: {:?}", alive.bindings);
    }
}
