//! Writing a repository entry atomically: `REPO/NAME/config.pbtxt` and
//! `REPO/NAME/VERSION/model.onnx` (+ external data), all renamed into place together.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use prost::Message;

use super::model_config::{plan, TritonConfig};
use super::{unservable, TritonOptions};
use crate::error::{Error, Result};
use crate::fs::{CreatedDirs, PendingFile};
use crate::gmlp::Interface;
use crate::message::{Phrase, Setting};
use crate::onnx::edit::relocate_external_data;
use crate::onnx::proto as onnx;
use crate::onnx::reader::{check_external_data, external_locations, metadata_value};
use crate::rebuild::rebuild;
use crate::runtime::ModelFile;

/// Name of the metadata property that marks a model served behind Triton's leading state
/// slot (a growing state, [`Interface::Triton`]).
pub const ADAPTER_METADATA_KEY: &str = "gmlp_onnx.triton_state_slot";
/// Name of the metadata property that marks a static-state model served with Triton's
/// position counter ([`Interface::Triton`]).
pub const COUNTER_METADATA_KEY: &str = "gmlp_onnx.triton_position_counter";

/// File name of the model inside a version directory (what the ONNX Runtime backend loads).
pub const MODEL_FILE: &str = "model.onnx";
/// File name of the external data beside [`MODEL_FILE`].
pub const DATA_FILE: &str = "model.onnx.data";

/// The paths of a repository entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepositoryPaths {
    /// `REPO/NAME`.
    pub model_dir: PathBuf,
    /// `REPO/NAME/config.pbtxt`.
    pub config: PathBuf,
    /// `REPO/NAME/VERSION`.
    pub version_dir: PathBuf,
    /// `REPO/NAME/VERSION/model.onnx`.
    pub model: PathBuf,
}

impl RepositoryPaths {
    /// The layout for `options` under `repo`.
    pub fn new(repo: &Path, options: &TritonOptions) -> Self {
        let model_dir = repo.join(&options.name);
        let version_dir = model_dir.join(options.version.to_string());
        RepositoryPaths {
            config: model_dir.join("config.pbtxt"),
            model: version_dir.join(MODEL_FILE),
            model_dir,
            version_dir,
        }
    }
}

/// Checks, before anything is written, that the entry can be created: valid options, the
/// repository is a directory (or can be created), the version directory is absent or
/// empty. Cheap; run it before a long build.
pub fn check_target(repo: &Path, options: &TritonOptions) -> Result<RepositoryPaths> {
    options.check()?;
    if repo.exists() && !repo.is_dir() {
        return Err(Error::OutputPath(format!(
            "model repository {} is not a directory",
            repo.display()
        )));
    }
    let paths = RepositoryPaths::new(repo, options);
    for dir in [&paths.model_dir, &paths.version_dir] {
        if dir.exists() && !dir.is_dir() {
            return Err(Error::OutputPath(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
    }
    if paths.version_dir.is_dir() {
        let mut entries =
            std::fs::read_dir(&paths.version_dir).map_err(|e| Error::io(&paths.version_dir, e))?;
        if entries.next().is_some() {
            return Err(Error::Setting(
                Phrase::text(format!(
                    "{} already exists and is not empty; pick another ",
                    paths.version_dir.display()
                ))
                .and(Setting::TritonVersion)
                .then(" or remove it"),
            ));
        }
    }
    Ok(paths)
}

/// What [`write_repository`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepositoryWritten {
    /// The paths of the entry.
    pub paths: RepositoryPaths,
    /// The external data file, when the model has one.
    pub data_file: Option<PathBuf>,
    /// The configuration written.
    pub config: TritonConfig,
}

/// Writes `REPO/NAME/config.pbtxt` and `REPO/NAME/VERSION/model.onnx` for the ONNX file
/// `model_path`. External data is copied too: one data file becomes `model.onnx.data`
/// (the locations inside the model are rewritten to match), several keep their names.
/// All files are written under temporary names and renamed into place together at the
/// end; on any error nothing is left behind (directories created here are removed).
/// An existing `config.pbtxt` (another version of the same model) is only replaced
/// by identical text; a different one is refused.
pub fn write_repository(
    model_path: &Path,
    repo: &Path,
    options: &TritonOptions,
) -> Result<RepositoryWritten> {
    write_repository_file(ModelFile::from(model_path), repo, options)
}

/// [`write_repository`] of a file the caller may have decoded already (`build
/// --triton-repo` hands over the model it decoded once): the file is decoded here only if
/// it has not been, and the served model is edited on a copy.
pub fn write_repository_file(
    file: ModelFile,
    repo: &Path,
    options: &TritonOptions,
) -> Result<RepositoryWritten> {
    let model_path = file.path;
    let paths = check_target(repo, options)?;
    let mut model = file.model()?.into_owned();
    check_external_data(&model, model_path)?;
    check_not_adapted(&model, model_path)?;
    let config = plan(&model, options)?;
    let text = config.to_pbtxt();
    let existing_config = existing_config(&paths.config, &text)?;

    let locations = external_locations(&model, model_path)?;
    let source_dir = match model_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let renamed = locations.len() == 1 && locations[0] != DATA_FILE;
    let served = served_model(&mut model, model_path, &config, renamed)?;

    let mut dirs = CreatedDirs::new();
    dirs.create(&paths.version_dir)?;
    let (mut pending, data_file) =
        stage_data_files(&paths.version_dir, &source_dir, &locations, renamed)?;
    let mut model_file = PendingFile::create(&paths.model)?;
    match &served {
        Some(bytes) => write_bytes(&mut model_file, &paths.model, bytes)?,
        None => model_file.copy_from(model_path)?,
    }
    pending.push(model_file);
    if existing_config.is_none() {
        let mut config_file = PendingFile::create(&paths.config)?;
        write_bytes(&mut config_file, &paths.config, text.as_bytes())?;
        pending.push(config_file);
    }
    // Data, model, then config: Triton polling the repository sees a complete version.
    PendingFile::persist_all(pending)?;
    dirs.commit();
    Ok(RepositoryWritten {
        paths,
        data_file,
        config,
    })
}

/// Refuses a model already served by [`write_repository`] (it carries the state slot's or
/// the position counter's metadata).
fn check_not_adapted(model: &onnx::ModelProto, model_path: &Path) -> Result<()> {
    if [ADAPTER_METADATA_KEY, COUNTER_METADATA_KEY]
        .iter()
        .any(|key| metadata_value(model, key).is_some())
    {
        return Err(unservable(format!(
            "{} already carries the Triton state adapter; give the original with-past model",
            model_path.display()
        )));
    }
    Ok(())
}

/// The `config.pbtxt` already at `path` (another version of the same model), if any;
/// refuses one that differs from `text`.
fn existing_config(path: &Path, text: &str) -> Result<Option<String>> {
    let existing = match std::fs::read_to_string(path) {
        Ok(old) => Some(old),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(path, e)),
    };
    if existing.as_ref().is_some_and(|old| *old != text) {
        return Err(Error::Setting(
            Phrase::text(format!(
                "{} exists and describes the model differently; remove it or pick another ",
                path.display()
            ))
            .and(Setting::TritonName),
        ));
    }
    Ok(existing)
}

/// The model served, encoded, where it is not the file as it is (`None`): a stateful
/// model emitted again with Triton's state interface ([`Interface::Triton`]: growing
/// states behind their leading slot, a static model's position as a counter; its weights
/// the file's) and marked so, or a `renamed` data file relocated.
fn served_model(
    model: &mut onnx::ModelProto,
    model_path: &Path,
    config: &TritonConfig,
    renamed: bool,
) -> Result<Option<Vec<u8>>> {
    if renamed {
        relocate_external_data(model, DATA_FILE);
    }
    let mark = if config.growing() {
        Some((
            ADAPTER_METADATA_KEY,
            "past_* inputs and present_* outputs carry one leading zero slot for Triton's implicit state",
        ))
    } else if config.counts_positions() {
        Some((
            COUNTER_METADATA_KEY,
            "position [batch, 1] is Triton's implicit state; triton_next_position = position + tokens of the request",
        ))
    } else {
        None
    };
    match mark {
        Some(mark) => rebuild(model, model_path, Interface::Triton, &[mark])
            .map(Some)
            .map_err(|e| match e {
                Error::ForeignModel(_) => unservable(format!(
                    "{} carries a state (past_* / present_*) but was not written by gmlp-onnx (no configuration in its metadata): Triton keeps a state only through the interface gmlp-onnx emits from a model's configuration; build the model with gmlp-onnx",
                    model_path.display()
                )),
                other => other,
            }),
        None if renamed => Ok(Some(model.encode_to_vec())),
        None => Ok(None),
    }
}

/// Copies each external data file at `locations` under `source_dir` into `version_dir`
/// under a temporary name (as [`DATA_FILE`] when `renamed`). Returns the pending files
/// and the first one's final path.
fn stage_data_files(
    version_dir: &Path,
    source_dir: &Path,
    locations: &[String],
    renamed: bool,
) -> Result<(Vec<PendingFile>, Option<PathBuf>)> {
    let mut pending = Vec::new();
    let mut data_file = None;
    for location in locations {
        let target_name = if renamed {
            DATA_FILE
        } else {
            location.as_str()
        };
        let target = version_dir.join(target_name);
        let mut file = PendingFile::create(&target)?;
        file.copy_from(&source_dir.join(location))?;
        pending.push(file);
        data_file.get_or_insert(target);
    }
    Ok((pending, data_file))
}

/// Writes `bytes` into the pending `file` of final path `path`.
fn write_bytes(file: &mut PendingFile, path: &Path, bytes: &[u8]) -> Result<()> {
    file.writer()
        .write_all(bytes)
        .map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests;
