"""gmlp_onnx: gMLP / aMLP networks ("Pay Attention to MLPs") to ONNX, from the notebook they live in.

>>> import gmlp_onnx
>>> r = gmlp_onnx.export(model, "model.onnx")            # a live module, a state dict or a checkpoint path
>>> gmlp_onnx.validate("model.onnx", reference=model)     # tract and ONNX Runtime against the module
>>> gen = gmlp_onnx.Generator("model.onnx")               # a causal model built with with_past
>>> gen.generate([3, 17, 5], max_new_tokens=8)

The work is the Rust library's (the same pipeline as ``gmlp-onnx build``, the same
generation loop as ``gmlp-onnx generate``); this package reads a module's tensors where
they are and turns keywords into the command's flags (dashes as underscores). Every error
is a :class:`GmlpOnnxError` (see ``gmlp_onnx._errors``). docs/python.md walks it through.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _errors, _native, _sources
from ._errors import *  # noqa: F401,F403  (the exception classes are part of the API)
from ._errors import GmlpOnnxError, InvalidArgumentError, ValidationError

__version__: str = _native.__version__

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export` wrote: the file, its configuration (as the file's metadata
    records it), the stored parameter count, the deployment target and opset, the sequence
    form (``fixed``, ``variable``, ``static``, ``growing``), the summary line ``gmlp-onnx
    build`` prints, the notes on choices made for the caller, and with ``validate=True``
    the validation's report."""

    path: str
    config: Dict[str, Any]
    parameters: int
    target: str
    summary: str
    opset: int
    mode: str
    notes: List[str] = field(default_factory=list)
    validation: Optional["ValidationReport"] = None


@dataclass(frozen=True)
class ValidationReport:
    """A validation's figures: per runtime and output, the worst relative error against the
    other runtimes and the reference (``pairs``), and ``passed``. ``data`` holds the whole
    report as ``gmlp-onnx validate --report`` writes it."""

    passed: bool
    pairs: List[Dict[str, Any]]
    text: str
    data: Dict[str, Any] = field(repr=False)

    def worst(self) -> Dict[str, float]:
        """The worst relative error (max|a - b| / max|reference|) of each compared pair, by
        ``"reference vs other"`` (``"module vs tract"``: 3e-7)."""
        return {f'{p["reference"]} vs {p["other"]}': max((o["max_rel"] for o in p["outputs"]), default=0.0) for p in self.pairs}


def export(source: Any, path: PathLike, **options: Any) -> ExportResult:
    """Writes the ONNX file of ``source``: what ``gmlp-onnx build --weights`` writes.

    ``source`` is a ``torch.nn.Module`` (read where it is: its CPU tensors are not
    copied), a state dict (``str`` -> torch tensor or numpy array), or a checkpoint path.
    ``options`` are the build command's flags as keywords, dashes as underscores
    (``causal=True``, ``with_past="static"``, ``dtype="int4"``, ``target="onnxruntime"``,
    ``opset=21``); what a module's classes keep (g-mlp-pytorch's ``causal``, ``act``,
    ``shift_tokens``) is read from it, and a keyword that contradicts it is refused.
    An existing ``path`` is replaced atomically; on an error nothing is written.
    """
    src = _sources.read_source(source)
    merged = _sources.merge_hints(src.hints, options, src.label)
    out = _native.export(src.tensors, src.path, src.label, os.fspath(path), merged)
    if out["validation"] is not None:
        out["validation"] = _report(out["validation"])
    return ExportResult(**out)


def validate(path: PathLike, reference: Any = None, **options: Any) -> ValidationReport:
    """Runs ``path`` in tract and ONNX Runtime on the same inputs and compares the outputs;
    with ``reference`` (a ``torch.nn.Module``), also with the module's own ``eval()``,
    ``no_grad`` outputs on those inputs. Raises :class:`ValidationError` (its message the
    worst figures, ``.report`` the whole report) when any pair misses the tolerance.

    ``options``: the validate command's flags as keywords (``runtimes="tract,ort-cpu"``,
    ``batch=2``, ``seed=0``, ``rtol=...``, ``atol=...``, ``ort_lib=...``).
    """
    path = os.fspath(path)
    expected = None
    inputs = None
    label = None
    if reference is not None:
        arrays, outputs = _native.validation_inputs(path, options)
        inputs_np = {name: _sources.array_of(dtype, shape, data) for name, dtype, shape, data in arrays}
        got = _sources.reference_outputs(reference, inputs_np, outputs)
        inputs = _sources.array_refs(inputs_np)
        expected = _sources.array_refs(got)
        label = _sources.module_label(reference)
    data = _native.validate(path, options, inputs, expected, label)
    return _report(data)


def _report(data: Dict[str, Any]) -> ValidationReport:
    return ValidationReport(passed=data["pass"], pairs=data["pairs"], text=data["text"], data=data)


def inspect(path: PathLike) -> Dict[str, Any]:
    """What ``gmlp-onnx inspect --json`` prints, as a dict."""
    return json.loads(_native.inspect(os.fspath(path)))


Prompt = Union[Sequence[int], Sequence[Sequence[int]]]


class Generator:
    """A causal token model loaded once (``runtime``: ``"tract"``, ``"ort-cpu"`` or
    ``"ort-cuda"``) for generating with the one loop ``gmlp-onnx generate`` runs.

    Generation releases the GIL while a step runs and comes back to Python between steps,
    so Ctrl-C raises ``KeyboardInterrupt`` (the generator stays usable) and generators in
    other threads run at the same time. ``options``: the generate command's runtime flags
    as keywords (``ort_lib``, ``threads``, ``device``).
    """

    def __init__(self, path: PathLike, runtime: str = "ort-cpu", **options: Any) -> None:
        self._native = _native.Generator(os.fspath(path), runtime, options)

    @property
    def runtime(self) -> str:
        """The runtime's name."""
        return self._native.runtime

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size."""
        return self._native.vocab_size

    @property
    def max_sequence(self) -> int:
        """Positions of the model: prompt plus new tokens at most."""
        return self._native.max_sequence

    @property
    def eos_token_id(self) -> Optional[int]:
        """The end token the file records, if any."""
        return self._native.eos_token_id

    @property
    def note(self) -> Optional[str]:
        """What the runtime does differently from running the file as it is, if anything."""
        return self._native.note

    @property
    def step_form(self) -> Optional[str]:
        """The static step the file runs: ``"fused"`` (built with ``target="onnxruntime"``),
        ``"portable-fusable"`` (``target="onnxruntime"`` would build it fused: ``gmlp-onnx
        generate --fused-gain`` measures the gain) or ``"portable"``; ``None`` for a file
        without a static state."""
        return self._native.step_form

    def generate(
        self,
        prompt_ids: Prompt,
        max_new_tokens: int = 16,
        temperature: float = 0.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        seed: Optional[int] = None,
        eos_token_id: Optional[int] = None,
    ) -> Union[List[int], List[List[int]]]:
        """The new tokens of ``prompt_ids`` (a list of ids, or a list of such lists for a
        batch): at most ``max_new_tokens``, ending with the end token where one is met
        (``eos_token_id``, else the file's). ``temperature=0`` is greedy."""
        prompts, single = _prompts(prompt_ids)
        tokens = self._native.generate(
            prompts, max_new_tokens, _sampling(temperature, top_k, top_p, seed), eos_token_id
        )
        return tokens[0] if single else tokens

    def stream(
        self,
        prompt_ids: Prompt,
        max_new_tokens: int = 16,
        temperature: float = 0.0,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        seed: Optional[int] = None,
        eos_token_id: Optional[int] = None,
    ) -> Iterator[Union[int, List[Optional[int]]]]:
        """Yields each step's picks as they are made: an ``int`` for one prompt, a list for a
        batch (``None`` for a sequence that has ended). The tokens are :meth:`generate`'s."""
        prompts, single = _prompts(prompt_ids)
        self._native.start(prompts, max_new_tokens, _sampling(temperature, top_k, top_p, seed), eos_token_id)
        while True:
            picks = self._native.step()
            if picks is None:
                return
            yield picks[0] if single else picks


def _sampling(temperature: float, top_k: Optional[int], top_p: Optional[float], seed: Optional[int]) -> Dict[str, Any]:
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}


def _prompts(prompt_ids: Prompt) -> "tuple[List[List[int]], bool]":
    if isinstance(prompt_ids, (str, bytes)):
        raise InvalidArgumentError("prompt_ids: token ids (a list of int, or a list of lists), not text")
    items = list(prompt_ids)
    if items and all(_is_int(t) for t in items):
        return [[int(t) for t in items]], True
    if items and all(not _is_int(p) for p in items):
        return [[int(t) for t in p] for p in items], False
    raise InvalidArgumentError("prompt_ids: a non-empty list of token ids, or a list of such lists")


def _is_int(value: Any) -> bool:
    return hasattr(value, "__index__") and not isinstance(value, bool)


def main() -> int:
    """The ``gmlp-onnx`` command (the ``[project.scripts]`` entry): the same parsing, output
    and exit codes as the Rust binary."""
    import sys

    return _native.main(sys.argv)


__all__ = [
    "export",
    "validate",
    "inspect",
    "Generator",
    "ExportResult",
    "ValidationReport",
    "main",
    "__version__",
] + _errors.__all__
