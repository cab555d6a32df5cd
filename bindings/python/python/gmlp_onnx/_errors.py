"""The exceptions of gmlp_onnx: one base, one class per kind of failure.

The Rust extension raises these by the name of the library error's kind
(``bindings/python/src/errors.rs`` holds the one table from ``gmlp_onnx::Error`` to these
names); a class derives from the built-in exception a caller would catch for that kind
(``ValueError`` where the caller's value is wrong, ``FileNotFoundError`` where a file is
missing), as polars' exception hierarchy does.
"""

from __future__ import annotations

from typing import Any


class GmlpOnnxError(Exception):
    """Base of every error gmlp_onnx raises; its message is one line."""


class InvalidArgumentError(GmlpOnnxError, ValueError):
    """An option or argument that is malformed, out of range or contradicts another."""


class OptionConflictError(InvalidArgumentError):
    """Options that cannot go together, or one that applies only with another."""


class OutOfRangeError(InvalidArgumentError):
    """A value outside what its option takes."""


class OutputPathError(InvalidArgumentError):
    """Output paths that would overwrite each other or the input, or cannot be written."""


class BatchShapeError(InvalidArgumentError):
    """Prompts in a shape the generator cannot take (an empty prompt, an empty batch)."""


class PastPositionsError(InvalidArgumentError):
    """Tokens that would pass the model's positions (prompt plus new tokens over n)."""


class OutsideVocabularyError(InvalidArgumentError):
    """A token id outside the model's vocabulary."""


class UnknownNameError(InvalidArgumentError):
    """A name that is none of the known ones (a preset); the message lists them."""


class UnknownOptionError(GmlpOnnxError, TypeError):
    """A keyword that is no option of the call (the build command's flags, dashes as underscores)."""


class ModuleMismatchError(InvalidArgumentError):
    """A keyword that contradicts what the module or its weights show (``causal=False`` for a
    causal module, a ``seq_len`` other than the spatial weights')."""


class UnsupportedModuleError(GmlpOnnxError, ValueError):
    """A module or state dict that is no gMLP/aMLP of a layout gmlp_onnx reads."""


class ConfigError(GmlpOnnxError, ValueError):
    """A model configuration that cannot be built."""


class CheckpointError(GmlpOnnxError, ValueError):
    """Weights that cannot make the model: missing, misshapen, of an unread type, or damaged."""


class NotFiniteError(CheckpointError):
    """A weight or input value that is NaN or infinite."""


class ModelFileError(GmlpOnnxError, ValueError):
    """An ONNX file that cannot be decoded or lacks what the call needs."""


class NeedsRebuildError(ModelFileError):
    """A model that cannot do what was asked as it was built; the message says how to build it."""


class UnservableModelError(ModelFileError):
    """A model a serving target (Triton, onnxruntime-genai) cannot take as it is."""


class ForeignModelError(ModelFileError):
    """An ONNX file gmlp_onnx did not write, asked for what only its own files record."""


class UnsupportedError(GmlpOnnxError, ValueError):
    """A request outside what gmlp_onnx does (an input element type, a folder name ONNX
    Runtime cannot take)."""


class TooLargeError(GmlpOnnxError, ValueError):
    """A model past a hard size limit."""


class GmlpOnnxFileNotFoundError(GmlpOnnxError, FileNotFoundError):
    """A file that does not exist."""


class GmlpOnnxOSError(GmlpOnnxError, OSError):
    """A file that could not be read or written for another reason."""


class RuntimeUnavailableError(GmlpOnnxError):
    """A runtime that cannot be used on this machine (no ONNX Runtime library, no GPU)."""


class RuntimeFailedError(GmlpOnnxError, RuntimeError):
    """A runtime that loaded the model but failed running it."""


class InternalError(GmlpOnnxError):
    """A bug in gmlp_onnx: please report it with the call that caused it."""


class ValidationError(GmlpOnnxError):
    """A file whose outputs disagree beyond the tolerance; ``.report`` holds the figures."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


__all__ = [
    "GmlpOnnxError",
    "InvalidArgumentError",
    "OptionConflictError",
    "OutOfRangeError",
    "OutputPathError",
    "BatchShapeError",
    "PastPositionsError",
    "OutsideVocabularyError",
    "UnknownNameError",
    "UnknownOptionError",
    "ModuleMismatchError",
    "UnsupportedModuleError",
    "ConfigError",
    "CheckpointError",
    "NotFiniteError",
    "ModelFileError",
    "NeedsRebuildError",
    "UnservableModelError",
    "ForeignModelError",
    "UnsupportedError",
    "TooLargeError",
    "GmlpOnnxFileNotFoundError",
    "GmlpOnnxOSError",
    "RuntimeUnavailableError",
    "RuntimeFailedError",
    "InternalError",
    "ValidationError",
]
