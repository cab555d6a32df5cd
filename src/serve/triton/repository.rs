//! Writing a repository entry atomically: `REPO/NAME/config.pbtxt` and
//! `REPO/NAME/VERSION/model.onnx` (+ external data), all renamed into place together.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use prost::Message;

use super::config::{plan, TritonConfig};
use super::state::{
    adapt_with_past, add_position_counter, ADAPTER_METADATA_KEY, COUNTER_METADATA_KEY,
};
use super::{unservable, TritonOptions};
use crate::error::{Error, Result};
use crate::fs::{CreatedDirs, PendingFile};
use crate::message::{Phrase, Setting};
use crate::onnx::edit::ModelEdit;
use crate::onnx::proto as onnx;
use crate::onnx::reader::{check_external_data, external_locations, metadata_value};
use crate::runtime::ModelFile;

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
    let reencode = edit_for_serving(&mut model, &config, renamed)?;

    let mut dirs = CreatedDirs::new();
    dirs.create(&paths.version_dir)?;
    let (mut pending, data_file) =
        stage_data_files(&paths.version_dir, &source_dir, &locations, renamed)?;
    let mut model_file = PendingFile::create(&paths.model)?;
    if reencode {
        write_bytes(&mut model_file, &paths.model, &model.encode_to_vec())?;
    } else {
        model_file.copy_from(model_path)?;
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

/// Refuses a model that already went through [`write_repository`]'s edits (it carries the
/// state adapter's or the position counter's metadata).
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

/// Edits `model` into the one served: growing states go behind the one-slot adapter, a
/// static model's position behind the counter (its fixed-size states are served as they
/// are), and a `renamed` data file is relocated. True when the model must be re-encoded.
fn edit_for_serving(
    model: &mut onnx::ModelProto,
    config: &TritonConfig,
    renamed: bool,
) -> Result<bool> {
    let growing = config.growing();
    let counted = config.counts_positions();
    let reencode = renamed || growing || counted;
    if growing {
        adapt_with_past(model, &config.states)?;
    }
    if counted {
        add_position_counter(model, &config.states)?;
    }
    if renamed {
        if let Some(mut edit) = ModelEdit::new(model) {
            edit.relocate_external_data(DATA_FILE);
        }
    }
    Ok(reencode)
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
