//! The decoding model, in three stages: what a causal token model built by this tool says
//! about decoding ([`DecodingModel`]: its sequence mode, positions, state tensors,
//! vocabulary and end token, read from the metadata); its file read once for a command
//! ([`DecodingFile`]: the decoded model and that description); and the model loaded on one
//! runtime ([`LoadedModel`]), apart from any decoder's state (as onnxruntime-genai keeps one
//! `Model` of sessions apart from each generator's `State`): loaded once per command and
//! runtime, then lent to each decoder over it
//! ([`Decoder::new`](crate::generation::Decoder::new)), one at a time. A loaded model runs
//! on one `Engine`: a runtime of runs (the state carried from run to run, or the prefix
//! re-run), or a session of bound buffers running the file with its step graph's outputs
//! (a static state written in place, resident.rs).

use std::path::{Path, PathBuf};

use crate::error::{one_line, Error, Remedy, Result};
use crate::generation::resident::step_graph;
use crate::gmlp::interface::{DecodingInfo, SequenceMode};
use crate::gmlp::metadata::{parse_config, CONFIG_KEY, DECODING_KEY, END_TOKEN_KEY};
use crate::gmlp::Task;
use crate::onnx::proto::ModelProto;
use crate::onnx::reader::{decode_model, metadata_value, read_model, updates_in_place};
use crate::runtime::{
    open, open_bound, BoundSession, ModelFile, ModelSource, Runtime, RuntimeKind, RuntimeOptions,
};

/// Checks that every id of `ids` lies in the vocabulary `0..vocab`, naming the first that
/// does not as `what` (`token id`, `end token`, …): the one vocabulary check of prompts,
/// fed tokens and end tokens.
pub fn check_vocabulary<'a>(
    ids: impl IntoIterator<Item = &'a i64>,
    vocab: usize,
    what: &str,
) -> Result<()> {
    match ids
        .into_iter()
        .find(|&&id| id < 0 || id as u64 >= vocab as u64)
    {
        Some(&id) => Err(Error::OutsideVocabulary {
            what: what.into(),
            id,
            vocab,
        }),
        None => Ok(()),
    }
}

/// What a model says about decoding: how it was emitted and its vocabulary.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodingModel {
    /// Mode, n and state names.
    pub info: DecodingInfo,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// A static-state model whose graph writes every `present_*` by a scatter that is the
    /// only reader of its `past_*` ([`updates_in_place`]), so the two may share a buffer.
    pub in_place: bool,
    /// The token that ends a sequence, if the model names one (metadata
    /// [`END_TOKEN_KEY`], `build --eos-token-id`; ignored when outside the vocabulary).
    pub end_token: Option<i64>,
}

impl DecodingModel {
    /// Reads the decoding description from our metadata; `None` for fixed-length models
    /// and files not written by this tool.
    pub fn of(model: &ModelProto) -> Option<DecodingModel> {
        let info = metadata_value(model, DECODING_KEY).and_then(DecodingInfo::parse)?;
        let cfg = metadata_value(model, CONFIG_KEY).and_then(parse_config)?;
        let in_place = info.mode == SequenceMode::Static
            && info
                .state
                .iter()
                .all(|s| updates_in_place(model, &s.past, &s.present));
        match cfg.task {
            Task::Tokens { vocab_size, .. } => Some(DecodingModel {
                info,
                vocab_size,
                in_place,
                end_token: metadata_value(model, END_TOKEN_KEY)
                    .and_then(|v| v.parse::<i64>().ok())
                    .filter(|&id| id >= 0 && (id as u64) < vocab_size as u64),
            }),
            Task::Vision { .. } | Task::Backbone { .. } => None,
        }
    }

    /// Reads `path` and requires a causal token model that can decode (variable length
    /// or with past), naming the fix otherwise.
    pub fn read(path: &Path) -> Result<DecodingModel> {
        DecodingModel::of_file(ModelFile::from(path))
    }

    /// [`DecodingModel::read`] of a file the caller may have decoded already.
    pub fn of_file(file: ModelFile) -> Result<DecodingModel> {
        let path = file.path;
        DecodingModel::of(&*file.model()?).ok_or_else(|| {
            Error::NeedsRebuild {
                reason: format!(
                    "{} is not a causal token model built by gmlp-onnx with a variable length or a carried state",
                    path.display()
                ),
                remedy: Remedy::BuildCausalWithPast,
            }
        })
    }
}

/// A causal token model's file read once for a command: the decoded model and its decoding
/// description, from which every runtime loads it ([`DecodingFile::load`]).
pub struct DecodingFile {
    path: PathBuf,
    model: ModelProto,
    description: DecodingModel,
}

impl DecodingFile {
    /// Decodes `path` and requires a causal token model that can decode (variable length
    /// or with past), naming the fix otherwise.
    pub fn read(path: &Path) -> Result<DecodingFile> {
        let model = read_model(path)?;
        let description = DecodingModel::of_file(ModelFile::decoded(path, &model))?;
        Ok(DecodingFile {
            path: path.to_path_buf(),
            model,
            description,
        })
    }

    /// A model held in memory as a decoding file named `label` (`bytes`, an encoded model
    /// with its weights inline): runtimes load it from memory, nothing is read from or
    /// written to `label`.
    pub fn from_bytes(label: &Path, bytes: &[u8]) -> Result<DecodingFile> {
        let model = decode_model(bytes, label)?;
        let description = DecodingModel::of_file(ModelFile::decoded(label, &model))?;
        Ok(DecodingFile {
            path: label.to_path_buf(),
            model,
            description,
        })
    }

    /// The decoded model.
    pub fn decoded(&self) -> &ModelProto {
        &self.model
    }

    /// The model's decoding description.
    pub fn description(&self) -> &DecodingModel {
        &self.description
    }

    /// The file with its decoded model, as runtimes open it.
    pub fn file(&self) -> ModelFile<'_> {
        ModelFile::decoded(&self.path, &self.model)
    }

    /// The model loaded in `kind` ([`LoadedModel::open`]), from the decoded model.
    pub fn load(
        &self,
        kind: RuntimeKind,
        options: &RuntimeOptions,
        writes: StateWrites,
    ) -> Result<LoadedModel> {
        LoadedModel::open(kind, self.file(), self.description.clone(), options, writes)
    }
}

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
            // tract's thread pool (`--threads`) serves every run, the single-token steps
            // included (their products split from 2^18 multiply-adds: `runtime::tract`).
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
mod tests;
