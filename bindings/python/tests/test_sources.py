"""The pure-Python part of gmlp_onnx (_sources.py: tensors read in place, the hints a
module's classes give, keywords against them, the module's own outputs), tested without
the Rust extension: _errors.py and _sources.py are loaded by file path into a stand-in
package, so these tests run before `maturin develop`."""

from __future__ import annotations

import copy
import ctypes
import importlib
import os
import pathlib
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import gmlp_models as G

PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[1] / "python" / "gmlp_onnx"
PURE = "_gmlp_onnx_pure"


def _load_pure():
    """_errors and _sources of the package, without its __init__ (which needs _native)."""
    if PURE not in sys.modules:
        pkg = types.ModuleType(PURE)
        pkg.__path__ = [str(PACKAGE_DIR)]
        sys.modules[PURE] = pkg
    return importlib.import_module(PURE + "._errors"), importlib.import_module(PURE + "._sources")


errors, S = _load_pure()


# ---------------------------------------------------------------------------------------
# Reading memory back the way the Rust side does: address, dtype, shape, element strides.

_NP = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int64": np.int64,
       "int32": np.int32, "bool": np.bool_, "uint8": np.uint8, "bfloat16": np.uint16}


def read_back(ref) -> np.ndarray:
    """The values at ``ref`` (bfloat16 widened to float32), read through its pointer."""
    dt = np.dtype(_NP[ref.dtype])
    if 0 in ref.shape:
        out = np.zeros(ref.shape, dtype=dt)
    else:
        extent = 1 + sum((n - 1) * s for n, s in zip(ref.shape, ref.strides))
        buf = (ctypes.c_char * (extent * dt.itemsize)).from_address(ref.data_ptr)
        flat = np.frombuffer(buf, dtype=dt, count=extent)
        out = np.lib.stride_tricks.as_strided(flat, shape=ref.shape, strides=[s * dt.itemsize for s in ref.strides]).copy()
    if ref.dtype == "bfloat16":
        out = (out.astype(np.uint32) << 16).view(np.float32)
    return out


def torch_values(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


def refs_by_name(refs):
    return {r.name: r for r in refs}


def one_line(e) -> bool:
    text = str(e.value if hasattr(e, "value") else e)
    return bool(text) and "\n" not in text


# ---------------------------------------------------------------------------------------
# read_source


def test_paths_are_passed_as_paths(tmp_path):
    for given in (str(tmp_path / "m.pt"), tmp_path / "m.pt"):
        src = S.read_source(given)
        assert src.tensors is None
        assert src.path == str(tmp_path / "m.pt")
        assert src.label == str(tmp_path / "m.pt")
        assert src.hints == {}
        assert src.module is None


def test_a_state_dict_of_numpy_arrays_is_read_in_place():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(5, dtype=np.int64)
    src = S.read_source({"a": a, "b": b})
    assert src.label == "state dict" and src.hints == {} and src.path is None and src.module is None
    refs = refs_by_name(src.tensors)
    assert refs["a"].data_ptr == a.ctypes.data and refs["a"].owner is a
    assert refs["a"].dtype == "float32" and refs["a"].shape == (3, 4) and refs["a"].strides == (4, 1)
    assert refs["b"].dtype == "int64" and refs["b"].strides == (1,)
    for name, arr in (("a", a), ("b", b)):
        np.testing.assert_array_equal(read_back(refs[name]), arr)


def test_non_contiguous_numpy_arrays_are_passed_with_their_strides():
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    t = base.T  # strides (1, 6)
    sliced = base[1:, ::2]  # an offset and a step
    refs = refs_by_name(S.array_refs({"t": t, "s": sliced}))
    assert refs["t"].strides == (1, 6) and refs["t"].data_ptr == base.ctypes.data
    assert refs["s"].strides == (6, 2) and refs["s"].data_ptr == base.ctypes.data + 6 * 8
    np.testing.assert_array_equal(read_back(refs["t"]), t)
    np.testing.assert_array_equal(read_back(refs["s"]), sliced)
    # A broadcast (stride 0) array is passed as it is.
    z = np.broadcast_to(np.float32(2.5), (3, 2))
    ref = S.array_refs({"z": z})[0]
    assert ref.strides == (0, 0)
    np.testing.assert_array_equal(read_back(ref), z)


def test_negative_strides_odd_strides_and_big_endian_arrays_are_copied():
    base = np.arange(10, dtype=np.float32)
    rev = base[::-1]
    ref = S.array_refs({"r": rev})[0]
    assert all(s >= 0 for s in ref.strides)
    assert ref.owner is not rev
    np.testing.assert_array_equal(read_back(ref), rev)
    # Strides that are not a whole number of elements (a field of a structured array).
    rec = np.zeros(4, dtype=[("x", np.float32), ("y", np.uint8)])
    rec["x"] = [1, 2, 3, 4]
    ref = S.array_refs({"x": rec["x"]})[0]
    assert ref.strides == (1,)
    np.testing.assert_array_equal(read_back(ref), [1, 2, 3, 4])
    big = np.arange(6, dtype=">f4")
    ref = S.array_refs({"b": big})[0]
    assert ref.dtype == "float32"
    np.testing.assert_array_equal(read_back(ref), np.arange(6, dtype=np.float32))


def test_zero_size_and_scalar_tensors():
    refs = refs_by_name(S.read_source({"e": torch.zeros(0, 3), "s": torch.tensor(1.5), "n": np.zeros((2, 0))}).tensors)
    assert refs["e"].shape == (0, 3)
    assert refs["s"].shape == () and refs["s"].strides == ()
    assert read_back(refs["s"]) == 1.5
    assert refs["n"].shape == (2, 0)


def test_torch_tensors_are_read_without_copying_whatever_their_strides():
    w = torch.randn(5, 7)
    t = w.t()  # non-contiguous
    sliced = w[2:, 1::3]  # an offset and a step
    expanded = torch.tensor([0.25]).expand(4)  # stride 0
    refs = refs_by_name(S.read_source({"t": t, "s": sliced, "x": expanded, "w": w}).tensors)
    assert refs["t"].strides == (1, 7) and refs["t"].data_ptr == w.data_ptr()
    assert refs["s"].strides == (7, 3) and refs["s"].data_ptr == sliced.data_ptr() == w.data_ptr() + (2 * 7 + 1) * 4
    assert refs["x"].strides == (0,)
    for name, value in (("t", t), ("s", sliced), ("x", expanded), ("w", w)):
        assert refs[name].owner is value
        np.testing.assert_array_equal(read_back(refs[name]), value.numpy())


def test_dtypes_are_named_and_bfloat16_is_read_as_stored():
    values = torch.randn(3, 4)
    state = {
        "f32": values,
        "bf16": values.to(torch.bfloat16),
        "f16": values.to(torch.float16),
        "f64": values.to(torch.float64),
        "i64": torch.arange(3),
        "i32": torch.arange(3, dtype=torch.int32),
        "b": torch.tensor([True, False]),
        "u8": torch.tensor([1, 2], dtype=torch.uint8),
    }
    refs = refs_by_name(S.read_source(state).tensors)
    names = {k: r.dtype for k, r in refs.items()}
    assert names == {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64",
                     "i64": "int64", "i32": "int32", "b": "bool", "u8": "uint8"}
    for k, t in state.items():
        assert refs[k].data_ptr == t.data_ptr()
        np.testing.assert_array_equal(read_back(refs[k]), torch_values(t))


def test_a_module_is_read_through_its_state_dict_with_parameters_that_require_grad(cases):
    m = cases["lucid_amlp"].module()
    assert all(p.requires_grad for p in m.parameters())
    src = S.read_source(m)
    assert src.module is m and src.path is None
    refs = refs_by_name(src.tensors)
    state = m.state_dict(keep_vars=True)
    assert list(refs) == list(state)
    for name, t in state.items():
        assert refs[name].data_ptr == t.data_ptr(), name  # not copied
        assert refs[name].owner is t
        np.testing.assert_array_equal(read_back(refs[name]), torch_values(t))


def test_a_bf16_module_with_a_non_contiguous_parameter_is_read_in_place(cases):
    m = cases["lucid_shift_causal"].module().to(torch.bfloat16)
    p = m.layers[0].fn.fn.fn.proj_in[0].weight
    p.data = p.data.t().contiguous().t()
    assert not p.is_contiguous()
    refs = refs_by_name(S.read_source(m).tensors)
    ref = refs["layers.0.fn.fn.fn.proj_in.0.weight"]
    assert ref.dtype == "bfloat16" and ref.data_ptr == p.data_ptr() and ref.strides == tuple(p.stride())
    np.testing.assert_array_equal(read_back(ref), p.detach().float().numpy())


def test_buffers_are_included(cases):
    m = cases["gpt_window"].module()
    names = [r.name for r in S.read_source(m).tensors]
    masks = [n for n in names if n.endswith("sgu.mask")]
    assert masks and {r.dtype for r in S.read_source(m).tensors if r.name in masks} == {"bool"}


def test_sparse_quantized_and_meta_tensors_are_refused_naming_the_tensor():
    with pytest.raises(errors.UnsupportedModuleError, match="'sp'") as e:
        S.read_source({"sp": torch.eye(3).to_sparse()})
    assert one_line(e)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated in torch
        q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
    with pytest.raises(errors.UnsupportedModuleError, match="'q'"):
        S.read_source({"q": q})
    with pytest.raises(errors.UnsupportedModuleError, match="'m'"):
        S.read_source({"m": torch.empty(3, device="meta")})


def test_other_objects_are_refused_at_once_in_one_line():
    for bad in (42, [1, 2], object(), None, (torch.zeros(1),)):
        with pytest.raises(errors.UnsupportedModuleError) as e:
            S.read_source(bad)
        assert one_line(e)
        assert isinstance(e.value, ValueError) and isinstance(e.value, errors.GmlpOnnxError)
    with pytest.raises(errors.UnsupportedModuleError, match="'epoch'") as e:
        S.read_source({"w": torch.zeros(2), "epoch": 3})
    assert one_line(e)
    with pytest.raises(errors.UnsupportedModuleError, match="state_dict"):
        S.read_source({"state_dict": {"w": torch.zeros(2)}})


def test_an_unknown_module_passes_its_state_dict_without_hints():
    m = nn.Linear(4, 3)
    src = S.read_source(m)
    assert src.label == "module torch.nn.modules.linear.Linear"
    assert src.hints == {}
    assert sorted(r.name for r in src.tensors) == ["bias", "weight"]


# ---------------------------------------------------------------------------------------
# Hints


@pytest.mark.parametrize("name", list(G.CASES))
def test_each_upstream_class_gives_the_hints_the_command_needs(cases, name):
    case = cases[name]
    m = case.module()
    src = S.read_source(m)
    assert src.label == case.label
    assert src.hints == case.hints
    # What the fixtures' meta.json "flags" say the command needs is among the hints.
    for key, value in case.flags.items():
        assert src.hints[key] == value, key


def test_a_subclass_of_an_upstream_class_gives_its_hints():
    from g_mlp_pytorch import gMLP

    class Mine(gMLP):
        pass

    m = G.jitter(Mine(**G.TOKENS, causal=True, shift_tokens=1), 0)
    src = S.read_source(m)
    assert src.hints == {"causal": True, "gate_act": "identity", "shift_tokens": 1}
    assert src.label.endswith(".Mine")


@pytest.mark.parametrize(
    "act,name",
    [(nn.Identity(), "identity"), (nn.Tanh(), "tanh"), (nn.Sigmoid(), "sigmoid"), (nn.ReLU(), "relu"),
     (nn.GELU(), "gelu"), (nn.SiLU(), "silu"), (torch.tanh, "tanh"), (torch.sigmoid, "sigmoid")],
)
def test_gate_activations_map_to_gate_act_values(act, name):
    from g_mlp_pytorch import gMLP

    assert S.read_source(gMLP(**G.TOKENS, act=act)).hints["gate_act"] == name
    assert name in S.GATE_ACTS


@pytest.mark.parametrize("act", [nn.LeakyReLU(0.1), nn.GELU(approximate="tanh"), nn.Softplus(), lambda x: x * 2])
def test_a_gate_activation_that_none_matches_is_refused_naming_it(act):
    from g_mlp_pytorch import gMLP

    with pytest.raises(errors.UnsupportedModuleError) as e:
        S.read_source(gMLP(**G.TOKENS, act=act))
    assert one_line(e)
    assert "act" in str(e.value)
    if isinstance(act, nn.Module):
        assert type(act).__name__ in str(e.value)


def test_layers_that_disagree_are_refused():
    from g_mlp_pytorch import gMLP

    m = gMLP(**G.TOKENS, act=nn.Tanh())
    m.layers[1].fn.fn.fn.sgu.act = nn.Sigmoid()
    with pytest.raises(errors.UnsupportedModuleError, match="different gate activations") as e:
        S.read_source(m)
    assert one_line(e)


def test_non_square_patches_and_grids_are_refused():
    from g_mlp_pytorch import gMLPVision
    from timm.layers import GatedMlp
    from timm.models.mlp_mixer import MlpMixer, SpatialGatingBlock

    with pytest.raises(errors.UnsupportedModuleError, match="2x4 patches"):
        S.read_source(gMLPVision(image_size=8, patch_size=(2, 4), num_classes=3, dim=16, depth=1))
    mixer = MlpMixer(img_size=(8, 16), patch_size=2, in_chans=1, num_classes=3, num_blocks=1, embed_dim=16, mlp_ratio=4,
                     block_layer=SpatialGatingBlock, mlp_layer=GatedMlp)
    with pytest.raises(errors.UnsupportedModuleError, match="4x8 grid"):
        S.read_source(mixer)


def test_g_mlp_gpt_seq_len_is_given_only_when_every_layer_is_windowed():
    from g_mlp_gpt import gMLPGPT

    some = gMLPGPT(**G.TOKENS, window=((4, 1), (G.SEQ, 1)), attn_dim=8)
    assert "seq_len" not in S.read_source(some).hints
    every = gMLPGPT(**G.TOKENS, window=((4, 1), (8, 2)), attn_dim=8)
    assert S.read_source(every).hints["seq_len"] == G.SEQ


# ---------------------------------------------------------------------------------------
# merge_hints


def test_merge_adds_the_hints_to_the_options():
    hints = {"causal": True, "gate_act": "tanh", "shift_tokens": 2}
    merged = S.merge_hints(hints, {"with_past": "static", "opset": 21}, G.LUCID_LABEL)
    assert merged == {"with_past": "static", "opset": 21, "causal": True, "gate_act": "tanh", "shift_tokens": 2}
    assert S.merge_hints({}, {"dtype": "int4"}, "state dict") == {"dtype": "int4"}


@pytest.mark.parametrize(
    "given",
    [{"causal": True}, {"causal": 1}, {"gate_act": "Tanh"}, {"gate_act": "tanh"}, {"gate_act": nn.Tanh()},
     {"shift_tokens": 2}, {"shift_tokens": np.int64(2)}, {"causal": None}, {"gate-act": "TANH"}],
)
def test_a_keyword_that_means_what_the_module_says_is_fine(given):
    hints = {"causal": True, "gate_act": "tanh", "shift_tokens": 2}
    merged = S.merge_hints(hints, given, G.LUCID_LABEL)
    assert merged == hints


@pytest.mark.parametrize(
    "given,key",
    [({"causal": False}, "causal"), ({"causal": 0}, "causal"), ({"gate_act": "sigmoid"}, "gate_act"),
     ({"gate_act": nn.Identity()}, "gate_act"), ({"shift_tokens": 1}, "shift_tokens"),
     ({"shift_tokens": 0}, "shift_tokens")],
)
def test_a_keyword_that_contradicts_the_module_is_refused_naming_both(given, key):
    hints = {"causal": True, "gate_act": "tanh", "shift_tokens": 2}
    with pytest.raises(errors.ModuleMismatchError) as e:
        S.merge_hints(hints, given, G.LUCID_LABEL)
    msg = str(e.value)
    assert one_line(e)
    assert msg.startswith(f"{key}=") and G.LUCID_LABEL in msg, msg
    assert isinstance(e.value, errors.InvalidArgumentError) and isinstance(e.value, ValueError)


def test_a_gate_act_given_as_a_module_is_passed_as_its_name():
    assert S.merge_hints({}, {"gate_act": nn.Tanh()}, "state dict") == {"gate_act": "tanh"}
    with pytest.raises(errors.UnsupportedModuleError):
        S.merge_hints({}, {"gate_act": nn.LeakyReLU()}, "state dict")


def test_the_contradiction_message_says_what_the_module_is():
    with pytest.raises(errors.ModuleMismatchError) as e:
        S.merge_hints({"causal": True}, {"causal": False}, G.LUCID_LABEL)
    assert str(e.value) == (
        "causal=False contradicts the module g_mlp_pytorch.g_mlp_pytorch.gMLP (its SpatialGatingUnit is causal)"
    )
    with pytest.raises(errors.ModuleMismatchError, match="g-mlp-gpt models are causal"):
        S.merge_hints({"causal": True}, {"causal": False}, "module g_mlp_gpt.g_mlp_gpt.gMLPGPT")
    with pytest.raises(errors.ModuleMismatchError, match="in_chans=3 .* takes 1 channel\\)"):
        S.merge_hints({"in_chans": 1}, {"in_chans": 3}, "module g_mlp_pytorch.g_mlp_pytorch.gMLPVision")


def test_merge_with_real_module_hints(cases):
    src = S.read_source(cases["lucid_shift_causal"].module())
    with pytest.raises(errors.ModuleMismatchError):
        S.merge_hints(src.hints, {"causal": False}, src.label)
    with pytest.raises(errors.ModuleMismatchError):
        S.merge_hints(src.hints, {"shift_tokens": 1}, src.label)
    assert S.merge_hints(src.hints, {"with_past": "static"}, src.label)["with_past"] == "static"


# ---------------------------------------------------------------------------------------
# array helpers


def test_array_of_makes_a_new_array_from_little_endian_bytes():
    for dtype, values in (("float32", [1.5, -2.0, 3.25, 0.0]), ("float64", [1e300, -1.0, 2.0, 3.0]),
                          ("int32", [1, -2, 3, 4]), ("int64", [2**40, -1, 0, 7])):
        data = np.array(values, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
        a = S.array_of(dtype, [2, 2], data)
        assert a.dtype == np.dtype(dtype) and a.shape == (2, 2)
        np.testing.assert_array_equal(a, np.array(values).reshape(2, 2).astype(dtype))
        assert a.flags.writeable and a.flags.owndata
    assert S.array_of("float32", [0, 3], b"").shape == (0, 3)


def test_array_refs_name_each_array():
    arrays = {"input_ids": np.zeros((2, 3), dtype=np.int64), "logits": np.ones((2, 3, 4), dtype=np.float32)}
    refs = S.array_refs(arrays)
    assert [r.name for r in refs] == ["input_ids", "logits"]
    assert refs[1].shape == (2, 3, 4) and refs[1].strides == (12, 4, 1) and refs[1].dtype == "float32"


def test_module_label():
    assert S.module_label(nn.Linear(2, 2)) == "module torch.nn.modules.linear.Linear"
    from g_mlp_gpt import gMLPGPT

    assert S.module_label(gMLPGPT(**G.TOKENS)) == "module g_mlp_gpt.g_mlp_gpt.gMLPGPT"


# ---------------------------------------------------------------------------------------
# reference_outputs


def test_reference_outputs_run_the_module_in_eval_and_restore_its_flags(cases):
    case = cases["lucid_causal_heads2"]
    m = case.module()
    m.train()
    m.layers[0].eval()  # mixed flags come back as they were
    before = [mod.training for mod in m.modules()]
    x = case.inputs(batch=2, length=10)
    seen = []
    hook = m.register_forward_hook(lambda mod, i, o: seen.append((mod.training, torch.is_grad_enabled())))
    out = S.reference_outputs(m, {"input_ids": x, "position": np.zeros(2, dtype=np.int64)}, ["logits", "present_0"])
    hook.remove()
    assert seen == [(False, False)]
    assert [mod.training for mod in m.modules()] == before
    assert list(out) == ["logits"]
    assert out["logits"].dtype == np.float32 and out["logits"].shape == (2, 10, G.VOCAB)
    np.testing.assert_array_equal(out["logits"], G.run_module(m, x))


def test_reference_outputs_restore_the_flags_after_an_exception():
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            raise RuntimeError("boom")

    m = Boom().train()
    with pytest.raises(RuntimeError, match="boom"):
        S.reference_outputs(m, {"pixel_values": np.zeros((1, 2), dtype=np.float32)}, ["logits"])
    assert m.training and m.lin.training


def test_reference_outputs_of_vision_and_bf16_modules_are_float32(cases):
    case = cases["lucid_vision"]
    m = case.module()
    x = case.inputs(batch=3)
    out = S.reference_outputs(m, {"pixel_values": x}, ["logits"])["logits"]
    np.testing.assert_allclose(out, G.run_module(m, x), rtol=0, atol=0)
    bf = copy.deepcopy(m).to(torch.bfloat16)
    out = S.reference_outputs(bf, {"pixel_values": x}, ["logits"])["logits"]
    assert out.dtype == np.float32 and out.shape == (3, 5)
    with torch.no_grad():
        want = bf(torch.from_numpy(x).to(torch.bfloat16)).float().numpy()
    np.testing.assert_array_equal(out, want)


def test_reference_outputs_refuse_what_is_not_a_module_or_has_no_primary_input(cases):
    with pytest.raises(errors.InvalidArgumentError):
        S.reference_outputs(lambda x: x, {"input_ids": np.zeros((1, 2), dtype=np.int64)}, ["logits"])
    with pytest.raises(errors.InvalidArgumentError, match="input_ids"):
        S.reference_outputs(cases["lucid_mlm"].module(), {"past_0": np.zeros(2, dtype=np.float32)}, ["logits"])


# ---------------------------------------------------------------------------------------
# The package without torch


def test_sources_import_without_torch():
    script = f"""
import sys, types, importlib
sys.modules['torch'] = None  # any import of torch fails
pkg = types.ModuleType('p'); pkg.__path__ = [{str(PACKAGE_DIR)!r}]; sys.modules['p'] = pkg
S = importlib.import_module('p._sources')
import numpy as np
src = S.read_source({{'a': np.zeros(3, dtype=np.float32)}})
assert src.tensors[0].dtype == 'float32'
assert S.read_source('x.pt').path == 'x.pt'
try:
    S.read_source(3)
except importlib.import_module('p._errors').UnsupportedModuleError:
    print('ok')
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"
