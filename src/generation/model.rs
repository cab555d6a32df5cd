//! The decoding model: what a causal token model built by this tool says about decoding
//! (its sequence mode, positions, state tensors, vocabulary and end token, read from the
//! metadata).

use std::path::Path;

use crate::error::{Error, Remedy, Result};
use crate::gmlp::decoding::{DecodingInfo, SequenceMode};
use crate::gmlp::metadata::{parse_config, CONFIG_KEY, DECODING_KEY, END_TOKEN_KEY};
use crate::gmlp::Task;
use crate::onnx::proto::ModelProto;
use crate::onnx::reader::{metadata_value, updates_in_place};
use crate::runtime::ModelFile;

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
        Some(bad) => Err(Error::InvalidArgument(format!(
            "{what} {bad} is outside the vocabulary 0..{vocab}"
        ))),
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
