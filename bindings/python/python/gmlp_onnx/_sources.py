"""What :func:`gmlp_onnx.export` is given, as the Rust side reads it.

A source is a checkpoint path, a state dict (``str`` -> torch tensor or numpy array) or a
``torch.nn.Module``. Its tensors are handed over where they are, as :class:`TensorRef`
(address, dtype, shape, strides in elements, and the object that keeps the memory alive):
CPU tensors are not copied, whatever their strides. A module's classes also keep what no
weight shows (g-mlp-pytorch's ``causal``, ``act``, ``shift_tokens``; g-mlp-gpt's ``act`` and
``seq_len``; gMLPVision's channels and patch): :func:`read_source` returns those as the
build command's keywords (``hints``), and :func:`merge_hints` refuses a keyword that
contradicts them.

torch is imported only when a torch object is met: the package imports without it.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from ._errors import InvalidArgumentError, ModuleMismatchError, UnsupportedModuleError

__all__ = [
    "TensorRef",
    "Source",
    "read_source",
    "array_refs",
    "array_of",
    "merge_hints",
    "module_label",
    "reference_outputs",
]


class TensorRef(NamedTuple):
    """One tensor as the Rust side reads it, in place: ``data_ptr`` is the address of
    element [0, ..., 0], ``strides`` are in elements (non-negative), ``owner`` keeps the
    memory alive while it is read."""

    name: str
    data_ptr: int
    dtype: str
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    owner: object


class Source(NamedTuple):
    """What to export: ``tensors`` (``None`` for a path), ``path`` (``None`` for tensors),
    ``label`` (how messages name the source), ``hints`` (build keywords the module's
    classes answer) and ``module`` (the module, if the source is one)."""

    tensors: Optional[List[TensorRef]]
    path: Optional[str]
    label: str
    hints: Dict[str, Any]
    module: Optional[Any]


# ---------------------------------------------------------------------------------------
# Reading a source


def read_source(source: Any) -> Source:
    """The tensors, label and hints of ``source``: a checkpoint path, a state dict or a
    ``torch.nn.Module``. Raises :class:`UnsupportedModuleError` for anything else."""
    if isinstance(source, (str, bytes, os.PathLike)):
        path = os.fsdecode(os.fspath(source))
        return Source(tensors=None, path=path, label=path, hints={}, module=None)
    if isinstance(source, dict):
        return Source(tensors=_dict_refs(source), path=None, label="state dict", hints={}, module=None)
    torch = _torch_if_loaded()
    if torch is not None and isinstance(source, torch.nn.Module):
        label = module_label(source)
        hints = _module_hints(source)
        state = source.state_dict(keep_vars=True)
        refs = []
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                refs.append(_torch_ref(name, value))
            # else: a module's `_extra_state` object, which holds no weights.
        return Source(tensors=refs, path=None, label=label, hints=hints, module=source)
    raise UnsupportedModuleError(
        f"cannot export a {_type_name(source)}: pass a torch.nn.Module, a state dict (str -> tensor) "
        "or a checkpoint path"
    )


def array_refs(arrays: Dict[str, np.ndarray]) -> List[TensorRef]:
    """:class:`TensorRef` of each numpy array, by name (copied only where the Rust side
    cannot read the array as it is: negative or odd strides, non-native byte order)."""
    return [_numpy_ref(name, np.asarray(a)) for name, a in arrays.items()]


def array_of(dtype: str, shape: List[int], data: bytes) -> np.ndarray:
    """A new numpy array of ``dtype`` (``"float32"``, ``"float64"``, ``"int32"``,
    ``"int64"``, ...) and ``shape`` from little-endian bytes."""
    try:
        dt = np.dtype(dtype).newbyteorder("<")
    except TypeError as e:
        raise InvalidArgumentError(f"unknown array type {dtype!r}") from e
    return np.frombuffer(data, dtype=dt).reshape([int(s) for s in shape]).astype(dt.newbyteorder("="), copy=True)


def _dict_refs(state: Dict[Any, Any]) -> List[TensorRef]:
    refs = []
    torch = _torch_if_loaded()
    for name, value in state.items():
        if not isinstance(name, str):
            raise UnsupportedModuleError(f"state dict key {name!r} is a {_type_name(name)}, not a str")
        if torch is not None and isinstance(value, torch.Tensor):
            refs.append(_torch_ref(name, value))
        elif isinstance(value, (np.ndarray, np.generic)):
            refs.append(_numpy_ref(name, np.asarray(value)))
        else:
            hint = ""
            if isinstance(value, dict):
                hint = " (a training checkpoint? pass its state dict entry, e.g. checkpoint['state_dict'])"
            raise UnsupportedModuleError(
                f"state dict entry {name!r} is a {_type_name(value)}, not a torch tensor or numpy array{hint}"
            )
    return refs


_TORCH_DTYPES = {
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float64": "float64",
}


def _torch_ref(name: str, t: Any) -> TensorRef:
    """A torch tensor in place (CPU, strided), or a CPU copy of it (other devices)."""
    import torch

    if t.is_sparse or t.layout != torch.strided:
        raise UnsupportedModuleError(f"tensor {name!r} is sparse ({t.layout}); store it dense")
    if t.is_quantized:
        raise UnsupportedModuleError(f"tensor {name!r} is quantized ({t.dtype}); store it as a float tensor")
    if t.is_meta:
        raise UnsupportedModuleError(f"tensor {name!r} is on the meta device: it has no values")
    if t.device.type != "cpu":
        t = t.detach().cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    try:
        ptr = int(t.data_ptr())
        strides = tuple(int(s) for s in t.stride())
    except (RuntimeError, NotImplementedError) as e:
        raise UnsupportedModuleError(f"tensor {name!r} has no readable memory ({type(t).__name__}): {_line(e)}") from e
    if any(s < 0 for s in strides):  # not made by torch today; refused by the Rust side
        t = t.contiguous()
        ptr, strides = int(t.data_ptr()), tuple(int(s) for s in t.stride())
    dtype = str(t.dtype).replace("torch.", "")
    return TensorRef(name, ptr, _TORCH_DTYPES.get(dtype, dtype), tuple(int(s) for s in t.shape), strides, t)


def _numpy_ref(name: str, a: np.ndarray) -> TensorRef:
    """A numpy array in place, or a contiguous native-order copy where needed."""
    if a.dtype.hasobject:
        raise UnsupportedModuleError(f"array {name!r} holds Python objects ({a.dtype}), not numbers")
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    item = a.dtype.itemsize
    if a.size and (item == 0 or any(s < 0 or s % item for s in a.strides)):
        a = np.ascontiguousarray(a)
    strides = tuple(s // item for s in a.strides) if item else tuple(0 for _ in a.shape)
    ptr = int(a.__array_interface__["data"][0])
    return TensorRef(name, ptr, a.dtype.name, tuple(int(s) for s in a.shape), strides, a)


# ---------------------------------------------------------------------------------------
# What a module's classes keep


_LUCID = "g_mlp_pytorch.g_mlp_pytorch."
_GPT = "g_mlp_gpt.g_mlp_gpt."
_TIMM_MIXER = "timm.models.mlp_mixer."

# The gate activations of `--gate-act` (gmlp_onnx::gmlp::GateAct, kebab-case).
GATE_ACTS = ("identity", "tanh", "sigmoid", "relu", "gelu", "silu")


def module_label(module: Any) -> str:
    """How messages name a module: ``"module "`` and its class's qualified name."""
    cls = type(module)
    return f"module {cls.__module__}.{cls.__qualname__}"


def _qualname(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _known_class(module: Any) -> Optional[str]:
    """The known upstream class ``module`` is (or derives from), by qualified name."""
    known = {
        _LUCID + "gMLP",
        _LUCID + "gMLPVision",
        _GPT + "gMLPGPT",
        _TIMM_MIXER + "MlpMixer",
    }
    for cls in type(module).__mro__:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in known:
            return name
    return None


def _submodules(module: Any, qualname: str) -> List[Any]:
    return [m for m in module.modules() if _qualname(m) == qualname]


def _module_hints(module: Any) -> Dict[str, Any]:
    """The build keywords the module's classes answer and no weight shows."""
    kind = _known_class(module)
    if kind == _LUCID + "gMLP":
        return _lucid_token_hints(module)
    if kind == _LUCID + "gMLPVision":
        return _lucid_vision_hints(module)
    if kind == _GPT + "gMLPGPT":
        return _gpt_hints(module)
    if kind == _TIMM_MIXER + "MlpMixer":
        _check_timm(module)
        # timm's gMLP mixes every patch with every other: never causal.
        return {"causal": False}
    return {}


def _one(values: List[Any], what: str, label: str) -> Any:
    """The one value all layers share, or :class:`UnsupportedModuleError`."""
    distinct = []
    for v in values:
        if v not in distinct:
            distinct.append(v)
    if len(distinct) != 1:
        raise UnsupportedModuleError(
            f"the {label} has layers with different {what} ({', '.join(map(repr, distinct))}); gmlp-onnx needs one for all"
        )
    return distinct[0]


def _lucid_common(module: Any) -> Dict[str, Any]:
    label = module_label(module)
    sgus = _submodules(module, _LUCID + "SpatialGatingUnit")
    if not sgus:
        raise UnsupportedModuleError(f"the {label} has no SpatialGatingUnit")
    causal = _one([bool(s.causal) for s in sgus], "causal settings", label)
    attn_causal = [bool(a.causal) for a in _submodules(module, _LUCID + "Attention")]
    if attn_causal and _one(attn_causal, "attention masks", label) != causal:
        raise UnsupportedModuleError(
            f"the {label} has {'causal' if causal else 'bidirectional'} SpatialGatingUnits but "
            f"{'causal' if not causal else 'bidirectional'} attention; gmlp-onnx needs them alike"
        )
    act = _one([gate_act_name(s.act, label) for s in sgus], "gate activations (act)", label)
    return {"causal": causal, "gate_act": act}


def _lucid_token_hints(module: Any) -> Dict[str, Any]:
    label = module_label(module)
    hints = _lucid_common(module)
    shifts = [tuple(int(s) for s in m.shifts) for m in _submodules(module, _LUCID + "PreShiftTokens")]
    shift = 0
    if shifts:
        amounts = _one(shifts, "token shifts", label)
        shift = max(amounts)
        first = 0 if hints["causal"] else -shift
        if amounts != tuple(range(first, shift + 1)):
            raise UnsupportedModuleError(
                f"the {label} shifts tokens by {amounts}, not range({first}, {shift + 1}) as gMLP(shift_tokens={shift}"
                f"{', causal=True' if hints['causal'] else ''}) does"
            )
    hints["shift_tokens"] = shift
    return hints


def _lucid_vision_hints(module: Any) -> Dict[str, Any]:
    label = module_label(module)
    hints = _lucid_common(module)
    hints["shift_tokens"] = 0
    embed = getattr(module, "to_patch_embed", None)
    try:
        rearrange, linear = embed[0], embed[1]
        lengths = dict(getattr(rearrange, "axes_lengths", {}))
        p1, p2 = int(lengths["p1"]), int(lengths["p2"])
        inputs = int(linear.in_features)
    except (TypeError, KeyError, IndexError, AttributeError, ValueError) as e:
        raise UnsupportedModuleError(
            f"the {label} has no patch embedding Rearrange(p1, p2) + Linear in to_patch_embed"
        ) from e
    if p1 != p2:
        raise UnsupportedModuleError(f"the {label} has {p1}x{p2} patches; gmlp-onnx supports square patches only")
    if p1 <= 0 or inputs % (p1 * p2):
        raise UnsupportedModuleError(
            f"the {label}'s patch embedding takes {inputs} inputs, not channels times {p1}x{p2} patches"
        )
    hints["in_chans"] = inputs // (p1 * p2)
    hints["patch_size"] = p1
    # The image's side is not kept (only the token count, in the spatial weights): the
    # command reads it as the square root of that count times the patch.
    return hints


def _gpt_hints(module: Any) -> Dict[str, Any]:
    label = module_label(module)
    global_sgus = _submodules(module, _GPT + "CausalSGU")
    local_sgus = _submodules(module, _GPT + "CausalLocalSGU")
    sgus = global_sgus + local_sgus
    if not sgus:
        raise UnsupportedModuleError(f"the {label} has no CausalSGU or CausalLocalSGU")
    act = _one([gate_act_name(s.act, label) for s in sgus], "gate activations (act)", label)
    # g-mlp-gpt models are always causal: `--causal` is redundant for them, and holds the
    # fact against a contradicting keyword.
    hints: Dict[str, Any] = {"causal": True, "gate_act": act}
    if not global_sgus:
        seq_len = getattr(module, "seq_len", None)
        if not isinstance(seq_len, int) or seq_len <= 0:
            raise UnsupportedModuleError(f"the {label} is windowed in every layer and keeps no seq_len")
        hints["seq_len"] = int(seq_len)
    return hints


def _check_timm(module: Any) -> None:
    """Refuses what a timm gMLP keeps and the weights would misread: a grid of patches that
    is not square (its token count may still be a square number)."""
    stem = getattr(module, "stem", None)
    grid = getattr(stem, "grid_size", None)
    if grid is not None and len(tuple(grid)) == 2 and tuple(grid)[0] != tuple(grid)[1]:
        raise UnsupportedModuleError(
            f"the {module_label(module)} has a {grid[0]}x{grid[1]} grid of patches; gmlp-onnx supports square images only"
        )


def gate_act_name(act: Any, label: str = "module") -> str:
    """The ``--gate-act`` value of a gate activation (a module such as ``nn.Tanh()``, a
    torch function such as ``torch.tanh``, or a name); :class:`UnsupportedModuleError` for
    one that none matches."""
    if isinstance(act, str):
        name = act.strip().lower().replace("_", "-")
        if name in GATE_ACTS:
            return name
        raise UnsupportedModuleError(f"gate activation {act!r} is none of {', '.join(GATE_ACTS)}")
    import torch
    import torch.nn.functional as F
    from torch import nn

    exact = {nn.Identity: "identity", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.ReLU: "relu", nn.SiLU: "silu"}
    kind = type(act)
    if kind in exact:
        return exact[kind]
    if kind is nn.GELU and getattr(act, "approximate", "none") == "none":
        return "gelu"
    functions: List[Tuple[Callable[..., Any], str]] = [
        (torch.tanh, "tanh"),
        (torch.sigmoid, "sigmoid"),
        (torch.relu, "relu"),
        (F.relu, "relu"),
        (F.gelu, "gelu"),
        (F.silu, "silu"),
        (F.tanh, "tanh"),
        (F.sigmoid, "sigmoid"),
    ]
    for fn, name in functions:
        if act is fn:
            return name
    shown = repr(act) if isinstance(act, nn.Module) else getattr(act, "__qualname__", _type_name(act))
    raise UnsupportedModuleError(
        f"the {label}'s gate activation (act) is {_line(shown)}, which no --gate-act matches "
        f"({', '.join(GATE_ACTS)}; GELU exact only)"
    )


# ---------------------------------------------------------------------------------------
# Keywords against hints


_REASONS = {
    "causal": lambda v, gpt: "g-mlp-gpt models are causal"
    if gpt
    else ("its SpatialGatingUnit is causal" if v else "its SpatialGatingUnit is not causal"),
    "gate_act": lambda v, gpt: f"its gate activation (act) is {v}",
    "shift_tokens": lambda v, gpt: f"it shifts tokens by {v}" if v else "it shifts no tokens",
    "in_chans": lambda v, gpt: f"its patch embedding takes {v} channel{'s' if v != 1 else ''}",
    "patch_size": lambda v, gpt: f"its patches are {v}x{v}",
    "seq_len": lambda v, gpt: f"its seq_len is {v}",
}


def merge_hints(hints: Dict[str, Any], options: Dict[str, Any], label: str) -> Dict[str, Any]:
    """``options`` with ``hints`` added; a keyword given that means what the hint says is
    fine (``True``/``1``, ``"tanh"``/``"Tanh"``/``nn.Tanh()``), one that contradicts it
    raises :class:`ModuleMismatchError`. A ``gate_act`` given as a module or function is
    passed as its name."""
    merged = dict(options)
    given = {k.replace("-", "_"): k for k in options}
    gate = given.get("gate_act")
    if gate is not None and options[gate] is not None and not isinstance(options[gate], str):
        merged[gate] = gate_act_name(options[gate], "gate_act keyword")  # nn.Tanh() -> "tanh"
    for key, hint in hints.items():
        if key not in given:
            merged[key] = hint
            continue
        original = given[key]
        value = options[original]
        if value is None:  # not given
            del merged[original]
            merged[key] = hint
            continue
        if not _same(key, value, hint):
            reason = _REASONS.get(key, lambda v, gpt: f"it has {key}={v!r}")(hint, "g_mlp_gpt" in label)
            raise ModuleMismatchError(f"{key}={_show(value)} contradicts the {label} ({reason})")
        del merged[original]
        merged[key] = hint
    return merged


def _show(value: Any) -> str:
    return _line(repr(value)) if not isinstance(value, str) else repr(value)


def _normal(key: str, value: Any) -> Any:
    """A keyword's value in a form that compares equal for equal meanings."""
    if key == "gate_act" and not isinstance(value, str):
        try:
            return gate_act_name(value)
        except (UnsupportedModuleError, ImportError):
            return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        text = value.strip().lower().replace("_", "-")
        if text in ("true", "yes", "on"):
            return 1
        if text in ("false", "no", "off"):
            return 0
        try:
            return int(text)
        except ValueError:
            return text
    if hasattr(value, "__index__"):
        return int(value.__index__())
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _same(key: str, value: Any, hint: Any) -> bool:
    try:
        return bool(_normal(key, value) == _normal(key, hint))
    except Exception:  # a value whose comparison fails is no match
        return False


# ---------------------------------------------------------------------------------------
# The module's own outputs


_PRIMARY_INPUTS = ("input_ids", "pixel_values", "inputs_embeds")


def reference_outputs(module: Any, inputs: Dict[str, np.ndarray], output_names: List[str]) -> Dict[str, np.ndarray]:
    """The module's own output (``eval()``, ``no_grad``) on the model's primary input
    (``input_ids``, ``pixel_values`` or ``inputs_embeds``; state and position inputs are
    the ONNX file's and ignored), as float32, under ``output_names[0]``. The module's
    training flags are restored afterwards."""
    torch = _torch_if_loaded()
    if torch is None or not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(f"reference: a torch.nn.Module, not a {_type_name(module)}")
    if not output_names:
        raise InvalidArgumentError("the model file has no outputs to compare")
    name = next((n for n in _PRIMARY_INPUTS if n in inputs), None)
    if name is None:
        raise InvalidArgumentError(
            f"reference: the model's inputs ({', '.join(inputs)}) have none of {', '.join(_PRIMARY_INPUTS)} to feed the module"
        )
    device, dtype = _device_and_dtype(module, torch)
    x = torch.from_numpy(np.ascontiguousarray(inputs[name]))
    if name == "input_ids":
        x = x.to(device=device, dtype=torch.int64)
    else:
        x = x.to(device=device, dtype=dtype)
    flags = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        with torch.no_grad():
            out = module(x)
    finally:
        for m, training in flags:
            m.training = training
    out = _first_tensor(out, torch, module_label(module))
    return {output_names[0]: out.detach().to(device="cpu", dtype=torch.float32).numpy()}


def _device_and_dtype(module: Any, torch: Any) -> Tuple[Any, Any]:
    """The device of the module's first tensor and its floating type (float32 without one)."""
    device = torch.device("cpu")
    dtype = torch.float32
    first = True
    for t in list(module.parameters()) + list(module.buffers()):
        if first:
            device = t.device
            first = False
        if t.is_floating_point():
            return t.device, t.dtype
    return device, dtype


def _first_tensor(out: Any, torch: Any, label: str) -> Any:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        for key in ("logits", "last_hidden_state"):
            if isinstance(out.get(key), torch.Tensor):
                return out[key]
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise InvalidArgumentError(f"the {label} returned a {_type_name(out)}, not a tensor")


# ---------------------------------------------------------------------------------------
# Small helpers


def _torch_if_loaded() -> Any:
    """torch if it is imported already (a torch object can only exist then), else None."""
    return sys.modules.get("torch")


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _line(value: Any) -> str:
    return " ".join(str(value).split())
