//! onnxruntime-genai model folders (docs/genai.md): `og.Model(DIR)` loads the folder and
//! `og.Generator` generates from it, with nothing written by hand. The folder holds
//! `model.onnx` (+ `model.onnx.data` for a file with external data), the built static-state
//! file emitted again with genai's interface ([`Interface::Genai`], [`crate::rebuild`]:
//! its configuration and weights, genai's names and shapes at the interface),
//! `genai_config.json` filled from the file's own metadata ([`genai_config`]), and for byte-level
//! models a tokenizer that `og.Tokenizer` reads ([`tokenizer`]). Everything is written
//! under temporary names and renamed into place together, like a Triton repository entry.
//!
//! genai's conventions, checked against its source (0.18: genai's config.cpp,
//! models/kv_cache.cpp, position_inputs.cpp, decoder_only.cpp): state as key/value
//! pairs of rank 4 with a fixed sequence dimension n (genai then shares one buffer for past
//! and present, which the scatters write in place; `max_length` ≤ n); `position_ids` and
//! `attention_mask` of one integer type; pad, end and start ids inside the vocabulary. A
//! model with no end token gets one it never emits ([`EndToken::Added`]).

pub mod genai_config;
pub mod tokenizer;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fs::{CreatedDirs, PendingFile};
use crate::gmlp::config::{GmlpConfig, Task};
use crate::gmlp::interface::{DecodingInfo, SequenceMode, StateStart};
use crate::gmlp::metadata::{parse_config, CONFIG_KEY, DECODING_KEY, END_TOKEN_KEY};
use crate::gmlp::Interface;
use crate::message::{Phrase, Setting};
use crate::onnx::edit::relocate_external_data;
use crate::onnx::reader::{check_external_data, external_locations, metadata_value};
use crate::rebuild::rebuild;
use crate::runtime::ModelFile;

pub use crate::gmlp::genai::{
    genai_layers, pair_states, GenaiLayer, Slot, ATTENTION_MASK, POSITION_IDS,
};
pub use genai_config::GenaiConfig;

/// File name of the model in the folder.
pub const MODEL_FILE: &str = "model.onnx";
/// File name of its external data.
pub const DATA_FILE: &str = "model.onnx.data";
/// File name of genai's configuration.
pub const CONFIG_FILE: &str = "genai_config.json";
/// Metadata key of a folder's model: its [`GenaiLayer`]s as JSON (which genai key/value
/// holds which state tensor of the built file).
pub const GENAI_METADATA_KEY: &str = "gmlp_onnx.genai_layers";
/// Byte-level vocabulary size: the models that get a tokenizer.
pub const BYTE_VOCABULARY: usize = 256;

/// The token that ends a sequence, as the folder declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndToken {
    /// One of the model's own ids.
    Model(i64),
    /// One id past the model's vocabulary, added with logit −∞ (the model has none).
    Added(i64),
}

impl EndToken {
    /// The id.
    pub fn id(self) -> i64 {
        match self {
            EndToken::Model(id) | EndToken::Added(id) => id,
        }
    }
}

/// What a folder is made with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GenaiOptions {
    /// The end token, overriding the model's own (metadata `gmlp_onnx.end_token`).
    pub end_token: Option<i64>,
}

/// What [`write_folder`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct FolderWritten {
    /// The folder.
    pub dir: PathBuf,
    /// Every file written, the model first.
    pub files: Vec<PathBuf>,
    /// The key/value layers.
    pub layers: Vec<GenaiLayer>,
    /// The declared end token.
    pub end_token: EndToken,
    /// Whether a tokenizer was written.
    pub tokenizer: bool,
    /// The configuration written.
    pub config: GenaiConfig,
}

/// A file genai cannot run, in one line.
fn refused(why: &str) -> Error {
    Error::Unservable(format!("{GENAI_REFUSES}{why}"))
}

/// A file genai cannot run as built, saying which settings build one it can.
fn refused_for_setting(why: Phrase) -> Error {
    Error::Setting(Phrase::text(GENAI_REFUSES).append(why))
}

const GENAI_REFUSES: &str = "onnxruntime-genai cannot run this model: ";

/// The end token of a model with `vocab` ids: `requested` if given, else the one its
/// metadata names, else an added one (id `vocab`).
pub fn end_token_for(
    model_end: Option<i64>,
    requested: Option<i64>,
    vocab: usize,
) -> Result<EndToken> {
    match requested.or(model_end) {
        Some(id) if id >= 0 && (id as u64) < vocab as u64 => Ok(EndToken::Model(id)),
        Some(id) => Err(Error::OutsideVocabulary {
            what: "end token".into(),
            id,
            vocab,
        }),
        None => Ok(EndToken::Added(vocab as i64)),
    }
}

/// The end token a built file names in its metadata ([`END_TOKEN_KEY`]), if any.
pub fn model_end_token(model: &crate::onnx::proto::ModelProto) -> Result<Option<i64>> {
    metadata_value(model, END_TOKEN_KEY)
        .map(|v| {
            v.parse::<i64>().map_err(|_| {
                Error::Unservable(format!("metadata {END_TOKEN_KEY} is not a token id: {v}"))
            })
        })
        .transpose()
}

/// Checks that `dir` can receive a folder: absent, or an empty directory.
pub fn check_target(dir: &Path) -> Result<()> {
    if dir.exists() {
        if !dir.is_dir() {
            return Err(Error::OutputPath(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        let mut entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        if entries.next().is_some() {
            return Err(Error::OutputPath(format!(
                "{} already exists and is not empty; pick another folder or remove it",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// Writes the genai folder `dir` for the static-state file `model_path` (see the module
/// doc). Refuses, writing nothing, a file genai cannot run: not causal, without state, the
/// growing state, not written by this tool, or stored otherwise than this version builds it.
pub fn write_folder(
    model_path: &Path,
    dir: &Path,
    options: &GenaiOptions,
) -> Result<FolderWritten> {
    write_folder_file(ModelFile::from(model_path), dir, options)
}

/// [`write_folder`] of a file the caller may have decoded already (`build --genai-dir`
/// hands over the model it decoded once): the file is decoded here only if it has not
/// been (its weights move into the folder's model).
pub fn write_folder_file(
    file: ModelFile,
    dir: &Path,
    options: &GenaiOptions,
) -> Result<FolderWritten> {
    let model_path = file.path;
    check_target(dir)?;
    let mut model = file.model()?.into_owned();
    check_external_data(&model, model_path)?;
    let (cfg, info, vocab_size) = built_token_model(&model)?;
    let end = end_token_for(model_end_token(&model)?, options.end_token, vocab_size)?;
    let layers = genai_layers(&cfg);
    let vocab_out = match end {
        EndToken::Model(_) => vocab_size,
        EndToken::Added(id) => id as usize + 1,
    };
    let config = GenaiConfig::new(
        MODEL_FILE,
        end.id(),
        vocab_out,
        info.max_sequence,
        cfg.d_model,
        layers.first().map_or(0, |l| l.width),
        layers.len(),
    );

    let locations = relocate_data(&mut model, model_path)?;
    let layers_json = serde_json::to_string(&layers).map_err(|e| Error::Internal(e.to_string()))?;
    let interface = Interface::Genai {
        added_end_token: matches!(end, EndToken::Added(_)),
    };
    let bytes = rebuild(
        &model,
        model_path,
        interface,
        &[(GENAI_METADATA_KEY, &layers_json)],
    )?;
    let source_dir = match model_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut dirs = CreatedDirs::new();
    dirs.create(dir)?;
    let mut staged = Staged::new(dir);
    for location in &locations {
        staged.copy(DATA_FILE, &source_dir.join(location))?;
    }
    staged.write(MODEL_FILE, &bytes)?;
    staged.write(CONFIG_FILE, config.to_json().as_bytes())?;
    let tokenizer = vocab_size == BYTE_VOCABULARY;
    if tokenizer {
        staged.write(
            "tokenizer.json",
            tokenizer::tokenizer_json(end.id()).as_bytes(),
        )?;
        staged.write(
            "tokenizer_config.json",
            tokenizer::tokenizer_config_json(end.id(), info.max_sequence).as_bytes(),
        )?;
    }
    let files = staged.persist()?;
    dirs.commit();
    Ok(FolderWritten {
        dir: dir.to_path_buf(),
        files,
        layers,
        end_token: end,
        tokenizer,
        config,
    })
}

/// The configuration, decoding description and vocabulary size of a token model this tool
/// built; refuses a folder's model, a file without this tool's configuration, a decoding
/// form genai cannot run and a model of another task.
fn built_token_model(
    model: &crate::onnx::proto::ModelProto,
) -> Result<(GmlpConfig, DecodingInfo, usize)> {
    if metadata_value(model, GENAI_METADATA_KEY).is_some() {
        return Err(refused(
            "it is already a genai folder's model; give the built file",
        ));
    }
    let cfg = metadata_value(model, CONFIG_KEY)
        .and_then(parse_config)
        .ok_or_else(|| {
            refused("it was not built by gmlp-onnx (no configuration in its metadata)")
        })?;
    let info = metadata_value(model, DECODING_KEY).and_then(DecodingInfo::parse);
    let info = check_decoding(info.as_ref())?.clone();
    let Task::Tokens { vocab_size, .. } = cfg.task else {
        return Err(refused("it is not a token model"));
    };
    Ok((cfg, info, vocab_size))
}

/// Refuses a model whose decoding form genai cannot run, saying what to build instead.
pub fn check_decoding(info: Option<&DecodingInfo>) -> Result<&DecodingInfo> {
    let Some(info) = info else {
        return Err(refused_for_setting(
            Phrase::text(
                "it is not a causal token model with a carried state (build a causal model with ",
            )
            .and(Setting::Causal)
            .then(" ")
            .and(Setting::WithPast)
            .then(")"),
        ));
    };
    match info.mode {
        SequenceMode::Static if info.state_start == StateStart::Zeroed => Err(refused_for_setting(
            Phrase::text(
                "its state buffers must start zeroed, which genai does not do on every device (build it with ",
            )
            .and(Setting::Target)
            .then(" ort, the default: its step ignores whatever the buffers hold)"),
        )),
        SequenceMode::Static => Ok(info),
        SequenceMode::Fixed | SequenceMode::Variable => Err(refused_for_setting(
            Phrase::text("it carries no state between runs (build it with ")
                .and(Setting::WithPast)
                .then(")"),
        )),
        SequenceMode::Growing => Err(refused_for_setting(
            Phrase::text("its state grows with every token, which genai cannot share in place (build it with ")
                .and(Setting::WithPast)
                .then(", the static state)"),
        )),
    }
}

/// The model's external data locations (at most one, refused otherwise), which the model
/// now names [`DATA_FILE`].
fn relocate_data(
    model: &mut crate::onnx::proto::ModelProto,
    model_path: &Path,
) -> Result<Vec<String>> {
    let locations = external_locations(model, model_path)?;
    if locations.len() > 1 {
        return Err(refused(
            "its weights are spread over several external data files",
        ));
    }
    if !locations.is_empty() {
        relocate_external_data(model, DATA_FILE);
    }
    Ok(locations)
}

/// The folder's files written so far, under temporary names until [`Staged::persist`].
struct Staged<'d> {
    dir: &'d Path,
    pending: Vec<PendingFile>,
    files: Vec<PathBuf>,
}

impl<'d> Staged<'d> {
    /// Nothing staged yet in `dir`.
    fn new(dir: &'d Path) -> Self {
        Staged {
            dir,
            pending: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Stages a copy of the file `from` as `name`.
    fn copy(&mut self, name: &str, from: &Path) -> Result<()> {
        let target = self.dir.join(name);
        let mut file = PendingFile::create(&target)?;
        file.copy_from(from)?;
        self.pending.push(file);
        self.files.push(target);
        Ok(())
    }

    /// Stages `bytes` as `name`.
    fn write(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = self.dir.join(name);
        let mut file = PendingFile::create(&path)?;
        file.writer()
            .write_all(bytes)
            .map_err(|e| Error::io(&path, e))?;
        self.pending.push(file);
        self.files.push(path);
        Ok(())
    }

    /// Renames every staged file into place; returns their paths, the model first.
    fn persist(self) -> Result<Vec<PathBuf>> {
        let mut files = self.files;
        // The model file first in the listing, as the doc says.
        let model_at = files
            .iter()
            .position(|f| f.ends_with(MODEL_FILE))
            .unwrap_or(0);
        files.swap(0, model_at);
        PendingFile::persist_all(self.pending)?;
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use ndarray::{ArrayD, IxDyn};

    use super::*;
    use crate::gmlp::SequenceMode;
    use crate::runtime::testing::{tiny, write_tiny};
    use crate::runtime::{open, RuntimeKind, RuntimeOptions};
    use crate::tensor::{NamedTensor, TensorValue};

    fn named(name: &str, value: TensorValue) -> NamedTensor {
        NamedTensor {
            name: name.into(),
            value,
        }
    }

    fn ids(values: &[i64]) -> TensorValue {
        TensorValue::I64(
            ArrayD::from_shape_vec(IxDyn(&[1, values.len()]), values.to_vec()).unwrap(),
        )
    }

    fn f32s(out: &[NamedTensor]) -> HashMap<String, ArrayD<f32>> {
        out.iter()
            .filter_map(|t| match &t.value {
                TensorValue::F32(a) => Some((t.name.clone(), a.clone())),
                _ => None,
            })
            .collect()
    }

    /// The folder's model, run by tract with genai's inputs, computes the built file's
    /// logits (plus the added end token's −∞) and state, over a prompt and a step that feeds
    /// the state back.
    #[test]
    fn the_folder_model_computes_the_built_files_logits_and_state() {
        let dir = tempfile::tempdir().unwrap();
        let built = write_tiny(dir.path(), SequenceMode::Static);
        let folder = dir.path().join("genai");
        let w = write_folder(&built, &folder, &GenaiOptions::default()).unwrap();
        let vocab = 50;
        assert_eq!(w.end_token, EndToken::Added(vocab));
        assert!(!w.tokenizer, "not a byte-level vocabulary");
        assert_eq!(w.config.model.vocab_size, 51);
        // tiny(): 2 aMLP blocks: (sgu.0, sgu.1), (key.0, value.0), (key.1, value.1).
        assert_eq!(w.layers.len(), 3);
        let info = DecodingInfo::of(&tiny(), SequenceMode::Static).unwrap();
        let n = info.max_sequence;
        let options = RuntimeOptions::default();
        let mut ours = open(RuntimeKind::Tract, &built, &options).unwrap();
        let mut theirs = open(RuntimeKind::Tract, &folder.join(MODEL_FILE), &options).unwrap();
        // genai's state names for each of ours: (past4, present4).
        let mut genai_name: HashMap<String, (String, String)> = HashMap::new();
        let mut spares = Vec::new();
        for l in &w.layers {
            for (past4, present4, slot) in l.tensors() {
                match slot {
                    Slot::State { past, present } => {
                        genai_name.insert(past.clone(), (past4.clone(), present4.clone()));
                        genai_name.insert(present.clone(), (past4, present4));
                    }
                    Slot::Spare => spares.push((past4, present4, l.width)),
                }
            }
        }
        assert!(spares.is_empty());
        // The folder's model describes its layers and no longer the built file's decoding.
        let folder_model = crate::onnx::reader::read_model(&folder.join(MODEL_FILE)).unwrap();
        let recorded = metadata_value(&folder_model, GENAI_METADATA_KEY).unwrap();
        assert_eq!(recorded, serde_json::to_string(&w.layers).unwrap());
        assert_eq!(metadata_value(&folder_model, DECODING_KEY), None);
        assert!(metadata_value(&folder_model, CONFIG_KEY).is_some());
        // Non-zero state going in, so that a misplaced row shows.
        let mut state: HashMap<String, ArrayD<f32>> = info
            .state
            .iter()
            .map(|s| {
                let a = ArrayD::from_shape_fn(IxDyn(&[1, n, s.width]), |i| {
                    ((i[1] * 7 + i[2] * 3) % 11) as f32 * 0.1 - 0.5
                });
                (s.past.clone(), a)
            })
            .collect();
        for (prompt, start) in [(vec![3i64, 17, 5, 49], 0i64), (vec![8], 4)] {
            let mut feed = vec![named("input_ids", ids(&prompt)), {
                named(
                    "position",
                    TensorValue::I64(ArrayD::from_elem(IxDyn(&[1]), start)),
                )
            }];
            let positions: Vec<i64> = (0..prompt.len() as i64).map(|t| start + t).collect();
            let mut genai_feed = vec![
                named("input_ids", ids(&prompt)),
                named(POSITION_IDS, ids(&positions)),
                named(ATTENTION_MASK, ids(&vec![1; start as usize + prompt.len()])),
            ];
            for s in &info.state {
                let a = state[&s.past].clone();
                let (past4, _) = &genai_name[&s.past];
                let a4 = a
                    .clone()
                    .into_shape_with_order(IxDyn(&[1, 1, n, s.width]))
                    .unwrap();
                genai_feed.push(named(past4, TensorValue::F32(a4)));
                feed.push(named(&s.past, TensorValue::F32(a)));
            }
            let a = f32s(&ours.run(&feed).unwrap());
            let b = f32s(&theirs.run(&genai_feed).unwrap());
            let (la, lb) = (&a["logits"], &b["logits"]);
            assert_eq!(lb.shape(), &[1, prompt.len(), vocab as usize + 1]);
            for t in 0..prompt.len() {
                for v in 0..vocab as usize {
                    assert_eq!(la[[0, t, v]], lb[[0, t, v]], "logit {t},{v}");
                }
                assert_eq!(lb[[0, t, vocab as usize]], f32::NEG_INFINITY);
            }
            for s in &info.state {
                let (_, present4) = &genai_name[&s.present];
                let got = b[present4]
                    .clone()
                    .into_shape_with_order(IxDyn(&[1, n, s.width]))
                    .unwrap();
                assert_eq!(a[&s.present], got, "{}", s.present);
                state.insert(s.past.clone(), got);
            }
        }
    }

    #[test]
    fn files_genai_cannot_run_are_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [SequenceMode::Variable, SequenceMode::Growing] {
            let built = write_tiny(dir.path(), mode);
            let folder = dir.path().join(format!("genai-{}", mode.as_str()));
            let e = write_folder(&built, &folder, &GenaiOptions::default()).unwrap_err();
            assert!(
                matches!(&e, Error::Setting(p) if p.settings().eq([crate::message::Setting::WithPast])),
                "{e:?}"
            );
            assert!(!folder.exists(), "{mode:?}: nothing written");
        }
        let built = write_tiny(dir.path(), SequenceMode::Static);
        let e = write_folder(
            &built,
            &dir.path().join("g"),
            &GenaiOptions {
                end_token: Some(50),
            },
        )
        .unwrap_err();
        assert!(
            matches!(e, Error::OutsideVocabulary { id: 50, .. }),
            "{e:?}"
        );
        // The model's own end token is kept (no added logit).
        let w = write_folder(
            &built,
            &dir.path().join("own"),
            &GenaiOptions { end_token: Some(7) },
        )
        .unwrap();
        assert_eq!(w.end_token, EndToken::Model(7));
        assert_eq!(w.config.model.vocab_size, 50);
        // A folder's own model is refused, and so is a non-empty target.
        let again = write_folder(
            &w.dir.join(MODEL_FILE),
            &dir.path().join("again"),
            &GenaiOptions::default(),
        );
        assert!(matches!(again, Err(Error::Unservable(_))), "{again:?}");
        let full = write_folder(&built, &w.dir, &GenaiOptions::default());
        assert!(matches!(full, Err(Error::OutputPath(_))), "{full:?}");
    }
}
