//! A file this tool wrote, emitted again with another [`Interface`]: the configuration,
//! target, opset and sequence mode its metadata records go through the same emitter that
//! wrote it ([`build_graph_for`]), and its weights move over from the file by name, each
//! tensor as the file stores it. Nothing is read from the file's nodes, and nothing is
//! added to its graph: the interface is the emitter's, written through the checked builder.
//!
//! The file's initializers must be the ones the configuration builds, name by name, with
//! their element types and dimensions (a file of another version whose parameters are
//! stored otherwise is refused, saying which tensor differs); its metadata, producer and
//! doc string are kept.

use std::path::Path;
use std::sync::Arc;

use clap::ValueEnum;

use crate::error::{Error, Remedy, Result};
use crate::gmlp::interface::DecodingInfo;
use crate::gmlp::metadata::{parse_config, CONFIG_KEY, DECODING_KEY, TARGET_KEY};
use crate::gmlp::targets::{BuildTarget, Target, DEFAULT_TARGET};
use crate::gmlp::{build_graph_for, Interface, ParamSpec, SequenceMode, WeightSource};
use crate::onnx::proto::ModelProto;
use crate::onnx::reader::metadata_value;
use crate::onnx::writer::{encode_with_stored, stored_mismatch, ModelInfo};

/// The encoded model `model` (the file at `path`, decoded) is, emitted again with
/// `interface`, its initializers the file's, its metadata the file's (less the decoding
/// description where the interface replaces it, [`Interface::keeps_decoding_description`])
/// followed by `added`.
/// Refused for a file without this tool's configuration ([`Error::ForeignModel`]) and for
/// one whose stored parameters this version's graph of that configuration does not take
/// ([`Error::NeedsRebuild`]).
pub fn rebuild(
    model: &ModelProto,
    path: &Path,
    interface: Interface,
    added: &[(&str, &str)],
) -> Result<Vec<u8>> {
    let cfg = metadata_value(model, CONFIG_KEY)
        .and_then(parse_config)
        .ok_or_else(|| {
            Error::ForeignModel(format!(
                "{} was not written by gmlp-onnx (no configuration in its metadata), so its graph cannot be emitted again",
                path.display()
            ))
        })?;
    let bad = |reason: &str| Error::BadModel {
        path: path.to_path_buf(),
        reason: reason.into(),
    };
    // Files from before the target was recorded were built for the default one.
    let target = match metadata_value(model, TARGET_KEY) {
        Some(name) => Target::from_str(name, false)
            .map_err(|_| bad(&format!("its metadata names an unknown target {name}")))?,
        None => DEFAULT_TARGET,
    };
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain().is_empty())
        .map(|o| o.version())
        .ok_or_else(|| bad("it imports no default-domain opset"))?;
    let mode = match metadata_value(model, DECODING_KEY) {
        Some(json) => {
            DecodingInfo::parse(json)
                .ok_or_else(|| bad("its decoding description does not parse"))?
                .mode
        }
        None => SequenceMode::Fixed,
    };
    let target = BuildTarget::resolve(target, Some(opset))?;
    let graph = build_graph_for(&cfg, Arc::new(StoredInFile), &target, mode, interface)?;
    let stored = &model
        .graph
        .as_ref()
        .ok_or_else(|| bad("the model has no graph"))?
        .initializer;
    if let Some(reason) = stored_mismatch(&graph, stored) {
        return Err(Error::NeedsRebuild {
            reason: format!(
                "{}: {reason}, where this version builds its configuration's weights otherwise",
                path.display()
            ),
            remedy: Remedy::RebuildWithThisVersion,
        });
    }
    let info = ModelInfo {
        producer_name: model.producer_name().to_string(),
        producer_version: model.producer_version().to_string(),
        doc_string: model.doc_string().to_string(),
        metadata: model
            .metadata_props
            .iter()
            .filter(|p| interface.keeps_decoding_description() || p.key() != DECODING_KEY)
            .map(|p| (p.key().to_string(), p.value().to_string()))
            .chain(added.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .collect(),
    };
    encode_with_stored(&graph, &info, stored)
}

/// The weights of a graph emitted again: the file's tensors, moved over as stored, so that
/// none is ever produced from here.
struct StoredInFile;

impl WeightSource for StoredInFile {
    fn values(&self, spec: &ParamSpec) -> Result<Vec<f32>> {
        Err(Error::Internal(format!(
            "{}: a graph emitted again takes its file's tensors, not produced ones",
            spec.name
        )))
    }
}

#[cfg(test)]
mod tests;
