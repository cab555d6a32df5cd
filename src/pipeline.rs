//! The build pipeline both front ends run (`gmlp-onnx build` and Python's
//! `gmlp_onnx.export`): from a model source (a configuration with its weights) and a
//! [`BuildRequest`] to the files, in one order — the target's spatial form and dtype
//! checks, the sequence form ([`choose_sequence`]), the graph, the end token, the file
//! written atomically with its progress, then what goes beside it (native weights, a
//! Triton repository, an onnxruntime-genai folder) from the file decoded once. A step
//! that fails removes every file written before it: a build leaves its whole result or
//! nothing. Options are checked by the front end in its own words before it gets here
//! (flags, keywords); the refusals that need the configuration (an end token for a model
//! without one, a genai folder without the static state) are worded as the command line's
//! flags, which the Python front end says as keywords.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::checkpoint::save_native;
use crate::error::{Error, Result};
use crate::gmlp::emit::StateScatter;
use crate::gmlp::export::{export_for, Export};
use crate::gmlp::metadata::END_TOKEN_KEY;
use crate::gmlp::targets::BuildTarget;
use crate::gmlp::{GmlpConfig, SequenceMode, Task, WeightSource};
use crate::message::Phrase;
use crate::onnx::proto::ModelProto;
use crate::onnx::reader::read_model;
use crate::onnx::writer::{write_model_with, ExternalData, Written};
use crate::runtime::ModelFile;
use crate::serve::genai::{end_token_for, write_folder_file, FolderWritten, GenaiOptions};
use crate::serve::triton::{write_repository_file, RepositoryWritten, TritonOptions};

/// What a build starts from: the configuration, the weights, their description (the
/// file's `gmlp_onnx.weights` provenance) and the preset's name when there is one.
pub struct ModelSource {
    /// The architecture (its spatial form already the target's where not chosen).
    pub config: GmlpConfig,
    /// The weights.
    pub weights: Arc<dyn WeightSource>,
    /// Where the weights come from, in words.
    pub description: String,
    /// The preset's name, for a preset.
    pub preset_name: Option<&'static str>,
}

/// The sequence form asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceChoice {
    /// The target's default for the model.
    Default,
    /// The static `[batch, n]` input (`--fixed-seq`).
    Fixed,
    /// A carried state: the form named, or the target's choice (said in a note).
    WithPast(Option<PastForm>),
}

/// The state form of a with-past build (docs/static-state.md): the values of
/// `--with-past` (and `with_past=` in Python).
// The variants' docs are `--help` lines, shapes in brackets as users read them.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PastForm {
    /// Fixed-size state [batch, n, ·] written in place, a `position` input [batch]
    /// (batches sequences at different positions; the default where the model and the
    /// target allow it).
    Static,
    /// State that grows with every token: past_* [batch, P, ·] in, present_* = past
    /// followed by the new rows out.
    Growing,
}

impl PastForm {
    /// The sequence mode this form builds.
    pub fn mode(self) -> SequenceMode {
        match self {
            PastForm::Static => SequenceMode::Static,
            PastForm::Growing => SequenceMode::Growing,
        }
    }
}

/// How to build: the target, the stored type, the sequence form, and the files.
pub struct BuildRequest {
    /// The ONNX file.
    pub output: PathBuf,
    /// The deployment profile and opset.
    pub target: BuildTarget,
    /// The sequence form asked for.
    pub sequence: SequenceChoice,
    /// The end token recorded in the file (causal token models).
    pub end_token: Option<i64>,
    /// Whether the weights always go to an external data file.
    pub external_data: bool,
    /// Also write the weights in the native layout here.
    pub save_weights: Option<PathBuf>,
    /// Also put the model into this Triton repository, with these options.
    pub triton: Option<(PathBuf, TritonOptions)>,
    /// Also write an onnxruntime-genai folder here.
    pub genai_dir: Option<PathBuf>,
    /// Keep the written file decoded for a check that follows (validate).
    pub keep_decoded: bool,
}

/// What the pipeline tells its front end while it works.
pub enum Event<'a> {
    /// A note on a choice made for the caller (the state form `with past` picked).
    Note(&'a Phrase),
    /// The weights' bytes to write.
    Writing(u64),
    /// Bytes of weights written so far.
    Written(u64),
    /// The model file is written.
    Finished,
}

/// What a build wrote.
pub struct Built {
    /// The configuration built (the dtype and spatial form applied).
    pub config: GmlpConfig,
    /// The sequence form built.
    pub mode: SequenceMode,
    /// The model file's sizes and its external data.
    pub written: Written,
    /// The line that says what was written.
    pub summary: String,
    /// Stored parameters (the metadata's count).
    pub parameters: u64,
    /// What was written beside the model, in order.
    pub beside: Vec<Beside>,
    /// The written file, decoded (with [`BuildRequest::keep_decoded`]).
    pub decoded: Option<ModelProto>,
}

/// A file or folder written beside the model.
pub enum Beside {
    /// The weights in the native layout.
    NativeWeights(PathBuf),
    /// A Triton model.
    Triton(Box<RepositoryWritten>),
    /// An onnxruntime-genai folder.
    Genai(Box<FolderWritten>),
}

/// The files a build has written so far. A later step that fails removes them all.
struct WrittenSoFar(Vec<PathBuf>);

impl WrittenSoFar {
    /// The model file `output` and its external data file, if any.
    fn of(output: &Path, written: &Written) -> WrittenSoFar {
        let mut files = vec![output.to_path_buf()];
        files.extend(written.data_file.iter().map(|(path, _)| path.clone()));
        WrittenSoFar(files)
    }

    /// `result`, after removing every file written so far if it is an error.
    fn or_remove<T>(&self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            for path in &self.0 {
                let _ = std::fs::remove_file(path);
            }
        }
        result
    }
}

/// Runs the pipeline: `source` built as `request` says, `events` told of notes and
/// progress.
pub fn build(
    source: ModelSource,
    request: &BuildRequest,
    events: &mut dyn FnMut(Event),
) -> Result<Built> {
    let ModelSource {
        config: cfg,
        weights,
        description,
        preset_name,
    } = source;
    let target = &request.target;
    target.check(cfg.spatial)?;
    target.check_dtype(cfg.dtype)?;
    let (mode, note) = choose_sequence(request.sequence, target, &cfg)?;
    if request.genai_dir.is_some() && mode != SequenceMode::Static {
        return Err(Error::Conflict(
            "--genai-dir needs the static state (--with-past or --with-past static): onnxruntime-genai cannot share a growing state in place".into(),
        ));
    }
    if let Some(note) = &note {
        events(Event::Note(note));
    }
    let mut model = export_for(
        &cfg,
        weights.clone(),
        &description,
        preset_name,
        target,
        mode,
    )?;
    record_end_token(request.end_token, &cfg, &mut model)?;
    let layout = if request.external_data {
        ExternalData::Always
    } else {
        ExternalData::Auto
    };
    let written = write_with_progress(&model, &request.output, layout, events)?;
    let summary = summary(&request.output, &cfg, target, mode, &model, &written);
    let parameters = model.counts.stored_params;
    drop(model);
    let mut so_far = WrittenSoFar::of(&request.output, &written);
    // What reads the file back (the Triton repository, the genai folder, validate) gets it
    // decoded once, here.
    let reads_back =
        request.keep_decoded || request.triton.is_some() || request.genai_dir.is_some();
    let decoded = match reads_back {
        true => Some(so_far.or_remove(read_model(&request.output))?),
        false => None,
    };
    let file = ModelFile {
        path: &request.output,
        decoded: decoded.as_ref(),
    };
    let beside = write_beside(request, &cfg, weights.as_ref(), file, &mut so_far)?;
    Ok(Built {
        config: cfg,
        mode,
        written,
        summary,
        parameters,
        beside,
        decoded: decoded.filter(|_| request.keep_decoded),
    })
}

/// The sequence form `choice` asks for, checked against the model, and the note that says
/// which form a plain with-past got.
pub fn choose_sequence(
    choice: SequenceChoice,
    target: &BuildTarget,
    cfg: &GmlpConfig,
) -> Result<(SequenceMode, Option<Phrase>)> {
    let (mode, note) = match choice {
        SequenceChoice::WithPast(Some(form)) => (form.mode(), None),
        SequenceChoice::WithPast(None) => {
            let (mode, note) = target.target.with_past_for(cfg);
            (mode, Some(note))
        }
        SequenceChoice::Fixed => (SequenceMode::Fixed, None),
        SequenceChoice::Default => (target.target.sequence_for(cfg), None),
    };
    mode.check(cfg)?;
    Ok((mode, note))
}

/// Records the end token in `model`'s metadata, refusing it for a model without token ids
/// or an id outside the vocabulary.
fn record_end_token(id: Option<i64>, cfg: &GmlpConfig, model: &mut Export) -> Result<()> {
    let Some(id) = id else { return Ok(()) };
    let vocab = match cfg.task {
        Task::Tokens { vocab_size, .. } if cfg.causal => vocab_size,
        _ => {
            return Err(Error::Conflict(
                "--eos-token-id applies to causal token models".into(),
            ))
        }
    };
    end_token_for(None, Some(id), vocab).map_err(|_| {
        Error::OutOfRange(format!(
            "--eos-token-id {id} is not one of the model's {vocab} token ids"
        ))
    })?;
    model
        .info
        .metadata
        .push((END_TOKEN_KEY.to_string(), id.to_string()));
    Ok(())
}

/// Writes `model` to `output`, telling `events` the bytes of weights written.
fn write_with_progress(
    model: &Export,
    output: &Path,
    layout: ExternalData,
    events: &mut dyn FnMut(Event),
) -> Result<Written> {
    // Progress in bytes of weights written (tensor k done → the first k tensors' bytes).
    let done_bytes: Vec<u64> = model
        .graph
        .initializers
        .iter()
        .scan(0u64, |acc, i| {
            *acc += i.byte_len() as u64;
            Some(*acc)
        })
        .collect();
    events(Event::Writing(model.graph.initializer_bytes()));
    let written = write_model_with(&model.graph, &model.info, output, layout, |k, _| {
        events(Event::Written(done_bytes[k - 1]))
    })?;
    events(Event::Finished);
    Ok(written)
}

/// Writes what goes beside the model, removing every file written so far, the model's
/// included, if one fails.
fn write_beside(
    request: &BuildRequest,
    cfg: &GmlpConfig,
    source: &dyn WeightSource,
    file: ModelFile,
    so_far: &mut WrittenSoFar,
) -> Result<Vec<Beside>> {
    let mut beside = Vec::new();
    if let Some(path) = &request.save_weights {
        so_far.or_remove(save_native(path, cfg, source))?;
        so_far.0.push(path.clone());
        beside.push(Beside::NativeWeights(path.clone()));
    }
    if let Some((repo, options)) = &request.triton {
        let w = so_far.or_remove(write_repository_file(file, repo, options))?;
        beside.push(Beside::Triton(Box::new(w)));
    }
    if let Some(dir) = &request.genai_dir {
        let w = so_far.or_remove(write_folder_file(file, dir, &GenaiOptions::default()))?;
        beside.push(Beside::Genai(Box::new(w)));
    }
    Ok(beside)
}

/// The line that says what was written: sizes, counts, target, opset, spatial form and,
/// for a model with state, its form (a static state's scatter as the emitter chose it).
fn summary(
    output: &Path,
    cfg: &GmlpConfig,
    target: &BuildTarget,
    mode: SequenceMode,
    model: &Export,
    written: &Written,
) -> String {
    let c = &model.counts;
    let data_note = match &written.data_file {
        Some((path, len)) => format!(
            " + {} ({:.1} MB of external data)",
            path.display(),
            *len as f64 / 1e6
        ),
        None => String::new(),
    };
    let state = match mode {
        SequenceMode::Static => format!(
            ", static state ({})",
            StateScatter::at_opset(target.opset).op_type()
        ),
        SequenceMode::Growing => ", growing state".to_string(),
        SequenceMode::Fixed | SequenceMode::Variable => String::new(),
    };
    format!(
        "wrote {} ({:.1} MB){data_note}: {} stored parameters, {} per example (paper convention), target {}, opset {}, spatial {}{state}",
        output.display(),
        written.model_bytes as f64 / 1e6,
        c.stored_params,
        crate::inspect::human_flops(c.flops),
        target.target.name(),
        target.opset,
        cfg.spatial.name()
    )
}
