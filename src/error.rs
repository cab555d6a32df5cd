//! The library's error type: one variant per kind of failure a user can act on.

use std::path::PathBuf;

use crate::message::Phrase;

/// Everything the library can refuse or fail at. Each message is one line and names
/// the offending file, tensor, or option.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model configuration that cannot be built (zero or absurd sizes, bad combinations).
    #[error("invalid model configuration: {0}")]
    InvalidConfig(String),
    /// A value that does not parse as what it names (a token id that is not a number, a
    /// name with characters its target cannot write); kinds of their own say the rest.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A name that is none of the known ones (a preset): the message lists them.
    #[error("invalid argument: {0}")]
    UnknownName(String),
    /// Options that cannot go together, or one that applies only with another (a vision
    /// option for a token model, a validation bound without validation).
    #[error("invalid argument: {0}")]
    Conflict(String),
    /// A value outside what its option takes (a size of 0, a tolerance below 0, too many
    /// runs).
    #[error("invalid argument: {0}")]
    OutOfRange(String),
    /// Output paths that would overwrite each other or the input, or a path that cannot be
    /// written (a directory, a missing folder).
    #[error("invalid argument: {0}")]
    OutputPath(String),
    /// A setting that contradicts what the weights show (a sequence length other than the
    /// spatial weights').
    #[error("invalid argument: {0}")]
    ContradictsWeights(String),
    /// Token ids in another shape than the decoder's batch takes (a count of prompts, an
    /// empty prompt, prompts of different lengths where the state cannot hold them).
    #[error("invalid argument: {0}")]
    BatchShape(String),
    /// The model would exceed a hard size limit; the message carries the estimate.
    #[error("{0}")]
    TooLarge(String),
    /// A file that could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// An ONNX file that could not be decoded or does not have the expected structure.
    #[error("{path}: not a usable ONNX model: {reason}")]
    BadModel {
        /// The ONNX file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Weights or input tensors that are missing, misshapen, or not finite.
    #[error("{0}")]
    BadTensor(String),
    /// A `.npy` array (alone or in an `.npz` archive) that cannot be read;
    /// [`ArrayFileError`] says why.
    #[error("{0}")]
    ArrayFile(#[from] ArrayFileError),
    /// A checkpoint whose tensors cannot make the model; [`CheckpointError`] says why.
    #[error("{0}")]
    Checkpoint(#[from] CheckpointError),
    /// A weight or input value that is NaN or infinite: the message names the tensor and
    /// the value's flat index.
    #[error("{0}")]
    NotFinite(String),
    /// Token ids that would take a sequence past the positions the model has (its
    /// `max_sequence`): the message says how many, after how many.
    #[error("invalid argument: {0}")]
    PastPositions(String),
    /// A token id outside the model's vocabulary: `what` names the id (`token id`,
    /// `prompt token id`, `end token`, …).
    #[error("invalid argument: {what} {id} is outside the vocabulary 0..{vocab}")]
    OutsideVocabulary {
        /// What the id is.
        what: String,
        /// The first id outside.
        id: i64,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A requested runtime (library, execution provider) is not usable on this machine.
    #[error("runtime {runtime} is unavailable: {reason}{}", remedy_clause(*remedy))]
    RuntimeUnavailable {
        /// Runtime name, e.g. `ort-cuda`.
        runtime: String,
        /// What is missing (and how to install it).
        reason: String,
        /// A setting that gets past it, when one does.
        remedy: Option<Remedy>,
    },
    /// A setting that cannot work as given, or an input that needs another setting; the
    /// message names the settings ([`Phrase`]: a front end shows them its own way, the
    /// command line as flags).
    #[error("{0}")]
    Setting(Phrase),
    /// Tensors of no layout this tool reads (or of several): the message names the markers
    /// seen and the setting that chooses one ([`Phrase`], as [`Error::Setting`]).
    #[error("{0}")]
    UnknownLayout(Phrase),
    /// A model that cannot do what was asked as it was built; `remedy` says how to build it.
    #[error("{reason}; {}", remedy.describe())]
    NeedsRebuild {
        /// What the model lacks.
        reason: String,
        /// How to build one that has it.
        remedy: Remedy,
    },
    /// A model a serving target (Triton, onnxruntime-genai) cannot take as it is: the
    /// message says what the target needs that the file lacks.
    #[error("{0}")]
    Unservable(String),
    /// An ONNX file this tool did not write (no `gmlp_onnx.config` metadata) asked for what
    /// only its own files record.
    #[error("{0}")]
    ForeignModel(String),
    /// A request inside the tool's range of kinds but outside what it does (an input element
    /// type, a folder name ONNX Runtime cannot take, a block the stepwise reference does
    /// not cover).
    #[error("{0}")]
    Unsupported(String),
    /// A bug in this program (e.g. two graph-builder helpers disagreeing on a shape): not
    /// the user's input. The command line reports it as an internal error (exit 101).
    #[error("internal error: {0}")]
    Internal(String),
    /// A runtime loaded the model but failed while preparing or running it.
    #[error("runtime {runtime} failed: {reason}")]
    RuntimeFailed {
        /// Runtime name.
        runtime: String,
        /// The runtime's own message, on one line.
        reason: String,
    },
}

/// Why a checkpoint's tensors cannot make the model, by what is wrong with the file; each
/// variant holds its one-line message (its `Display`), which names the file or tensor.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// Tensors the model needs are not in the file.
    #[error("{0}")]
    Missing(String),
    /// A tensor of another shape or rank than the model's.
    #[error("{0}")]
    WrongShape(String),
    /// Block indices that do not run 0..L (a gap, or no block at all).
    #[error("{0}")]
    Depth(String),
    /// An element type weights are not read from.
    #[error("{0}")]
    ElementType(String),
    /// A file of a format this reads whose bytes contradict it (cut short, offsets out of
    /// order, data of another size than its shape).
    #[error("{0}")]
    Damaged(String),
    /// A file that is in no checkpoint format this reads (too short, unknown bytes).
    #[error("{0}")]
    NotACheckpoint(String),
}

/// Why a `.npy` array cannot be read, by what is wrong with it; each variant holds its
/// one-line message (its `Display`), which names the array.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArrayFileError {
    /// Bytes that are not a `.npy` array or contradict themselves (no magic, a header cut
    /// short or missing a field, data of another size than the shape's).
    #[error("{0}")]
    Malformed(String),
    /// A valid array in a form this reader does not read (a format version, a dtype,
    /// Fortran order).
    #[error("{0}")]
    Unsupported(String),
    /// A rank or element count past this reader's bounds.
    #[error("{0}")]
    TooLarge(String),
}

/// A change of setting that gets past an error, as a whole clause whose wording differs
/// between the library ([`Remedy::describe`]) and the command line (its one table,
/// `cli::remedy_flags`); a setting named inside a sentence is a [`crate::message::Setting`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remedy {
    /// Name ONNX Runtime's library file (`OrtOptions::library`).
    OrtLibrary,
    /// Build a causal token model that carries a state (`GmlpConfig::causal`, a
    /// `SequenceMode` with past).
    BuildCausalWithPast,
    /// Build the static state (`SequenceMode::Static`), whose sequences each keep their
    /// own position.
    BuildStaticState,
    /// Run on ONNX Runtime (ort-cpu or ort-cuda), or build for the `ort` target, whose
    /// static state tract reads.
    OrtRuntimeOrOrtTarget,
    /// Build an ONNX model from a checkpoint (`checkpoint::Import`, then
    /// `gmlp::export::export`).
    BuildFromCheckpoint,
    /// Build the file again from its checkpoint with this version of the tool (a file of
    /// another version whose weights this version's graph does not take as they are).
    RebuildWithThisVersion,
}

impl Remedy {
    /// The change in the library's terms.
    pub fn describe(self) -> &'static str {
        match self {
            Remedy::OrtLibrary => "or name the library file (OrtOptions::library)",
            Remedy::BuildCausalWithPast => {
                "build a causal token model with a carried state (causal, with past)"
            }
            Remedy::BuildStaticState => "build it with the static state (SequenceMode::Static)",
            Remedy::OrtRuntimeOrOrtTarget => {
                "run it on ort-cpu or ort-cuda, or build it for the ort target for tract"
            }
            Remedy::BuildFromCheckpoint => {
                "build an ONNX model from it first (checkpoint::Import, then gmlp::export::export)"
            }
            Remedy::RebuildWithThisVersion => {
                "build it again from its checkpoint with this version (gmlp::export::export)"
            }
        }
    }
}

fn remedy_clause(remedy: Option<Remedy>) -> String {
    remedy.map_or_else(String::new, |r| format!("; {}", r.describe()))
}

/// Library result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The message without its remedy, and the remedy, for an error that has one: a
    /// front end names the remedy its own way (the command line as a flag).
    pub fn remedy(&self) -> Option<(String, Remedy)> {
        match self {
            Error::RuntimeUnavailable {
                runtime,
                reason,
                remedy: Some(remedy),
            } => Some((
                format!("runtime {runtime} is unavailable: {reason}"),
                *remedy,
            )),
            Error::NeedsRebuild { reason, remedy } => Some((reason.clone(), *remedy)),
            _ => None,
        }
    }

    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Folds a multi-line message from a third-party library onto one line.
pub(crate) fn one_line(message: impl std::fmt::Display) -> String {
    let text = message.to_string();
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

thread_local! {
    static CONTAINING_PANIC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True while this thread runs inside `contain_panic`: a process-wide panic hook should
/// stay quiet, because the panic will come back as an [`Error::RuntimeFailed`].
pub fn panic_is_contained() -> bool {
    CONTAINING_PANIC.with(|c| c.get())
}

/// Runs `f`, turning a panic inside it (a third-party runtime tripping over a hostile
/// model) into [`Error::RuntimeFailed`] for `runtime`, so that one bad model ends in a
/// one-line error rather than an abort.
pub(crate) fn contain_panic<T>(runtime: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let was = CONTAINING_PANIC.with(|c| c.replace(true));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CONTAINING_PANIC.with(|c| c.set(was));
    outcome.unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::RuntimeFailed {
            runtime: runtime.into(),
            reason: one_line(format!("it failed internally on this model: {message}")),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contained_panic_becomes_a_runtime_error_and_the_flag_is_restored() {
        assert!(!panic_is_contained());
        let seen_inside = std::cell::Cell::new(false);
        let result: Result<()> = contain_panic("tract", || {
            seen_inside.set(panic_is_contained());
            panic!("shape {} overflows\nsecond line", 7)
        });
        assert!(seen_inside.get());
        assert!(!panic_is_contained());
        let message = result.unwrap_err().to_string();
        assert_eq!(
            message,
            "runtime tract failed: it failed internally on this model: shape 7 overflows second line"
        );
        let fine: Result<u8> = contain_panic("tract", || Ok(3));
        assert_eq!(fine.unwrap(), 3);
    }
}
