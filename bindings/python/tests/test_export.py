"""gmlp_onnx.export, validate and inspect against the upstream modules themselves, ONNX
Runtime and the `gmlp-onnx` command (acceptance items 1-4 and 7-9)."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import onnx
import pytest
import torch

import gmlp_onnx
import gmlp_models as G

BOUND = 1e-5  # ||onnx - module|| / ||module||, f32
WEIGHTS_KEY = "gmlp_onnx.weights"


def check_against_module(path, module, case, ort_run, bound=BOUND, reference=None):
    """Runs ``path`` in ONNX Runtime on the case's inputs (and, for causal token models, a
    shorter length too) and compares the first output with the module's own."""
    reference = module if reference is None else reference
    lengths = [None, 5] if case.causal else [None]
    for length in lengths:
        x = case.inputs(batch=2, length=length, seed=1)
        want = G.run_module(reference, x)
        got = ort_run(path, {case.input_name: x})[0]
        err = G.rel_error(got, want)
        assert err <= bound, f"{case.name} (length {length}): ONNX Runtime vs module {err:.2e} > {bound:.0e}"


def check_validate(path, module, label_part):
    """validate(path, reference=module): passed, with pairs of the module against tract and ort-cpu."""
    report = gmlp_onnx.validate(path, reference=module)
    assert isinstance(report, gmlp_onnx.ValidationReport)
    assert report.passed, report.text
    worst = report.worst()
    for runtime in ("tract", "ort-cpu"):
        pairs = [k for k in worst if runtime in k and label_part in k]
        assert pairs, f"no pair of the module ({label_part}) with {runtime} in {sorted(worst)}"
        assert all(worst[k] <= 1e-4 for k in pairs), worst
    return report


def strip_weights_key(model: onnx.ModelProto):
    """The model without its provenance entry, and that entry's value."""
    m = copy.deepcopy(model)
    kept = [p for p in m.metadata_props if p.key != WEIGHTS_KEY]
    value = [p.value for p in m.metadata_props if p.key == WEIGHTS_KEY]
    del m.metadata_props[:]
    m.metadata_props.extend(kept)
    return m, value


def assert_same_file_but_provenance(a_path, b_path):
    a, b = onnx.load(str(a_path)), onnx.load(str(b_path))
    a_meta = {p.key: p.value for p in a.metadata_props if p.key != WEIGHTS_KEY}
    b_meta = {p.key: p.value for p in b.metadata_props if p.key != WEIGHTS_KEY}
    assert a_meta == b_meta
    assert a.graph.SerializeToString(deterministic=True) == b.graph.SerializeToString(deterministic=True)
    a2, wa = strip_weights_key(a)
    b2, wb = strip_weights_key(b)
    assert len(wa) == 1 and len(wb) == 1, "each file records where its weights came from"
    assert a2.SerializeToString(deterministic=True) == b2.SerializeToString(deterministic=True)


# ---------------------------------------------------------------------------------------
# 1. Every module, exported with no keyword it can answer


@pytest.mark.parametrize("name", list(G.CASES))
def test_each_module_exported_without_keywords_matches_it_in_onnx_runtime_and_validate(cases, name, tmp_path, ort_run):
    case = cases[name]
    m = case.module()
    path = tmp_path / f"{name}.onnx"
    result = gmlp_onnx.export(m, path)
    assert isinstance(result, gmlp_onnx.ExportResult)
    assert result.path == str(path) and path.is_file()
    assert result.parameters > 0 and result.summary
    check_against_module(path, m, case, ort_run)
    check_validate(path, m, type(m).__qualname__)


def test_a_numpy_state_dict_with_the_flags_matches_the_module(cases, tmp_path, ort_run):
    case = cases["lucid_shift_causal"]
    m = case.module()
    state = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    # One array as a transposed view, passed as it is.
    key = "layers.0.fn.fn.fn.proj_in.0.weight"
    state[key] = np.ascontiguousarray(state[key].T).T
    assert not state[key].flags.c_contiguous
    path = tmp_path / "numpy.onnx"
    gmlp_onnx.export(state, path, **case.flags)
    check_against_module(path, m, case, ort_run)


def test_a_pt_checkpoint_path_with_the_flags_gives_the_modules_file(cases, tmp_path, ort_run):
    case = cases["lucid_act_tanh"]
    m = case.module()
    pt = tmp_path / "model.pt"
    torch.save(m.state_dict(), pt)
    from_path = tmp_path / "from_path.onnx"
    from_module = tmp_path / "from_module.onnx"
    gmlp_onnx.export(str(pt), from_path, **case.flags)
    gmlp_onnx.export(m, from_module)
    check_against_module(from_path, m, case, ort_run)
    assert_same_file_but_provenance(from_path, from_module)


# ---------------------------------------------------------------------------------------
# 2. The same file as the command


@pytest.mark.parametrize("name", ["lucid_shift_causal", "timm_gmlp", "gpt_window", "gpt_heads2_sigmoid", "lucid_vision"])
def test_export_writes_the_file_the_command_writes(cases, name, tmp_path, run_cli):
    case = cases[name]
    m = case.module()
    pt = tmp_path / "weights.pt"
    torch.save(m.state_dict(), pt)
    exported = tmp_path / "export.onnx"
    built = tmp_path / "build.onnx"
    gmlp_onnx.export(m, exported)
    run_cli("build", "--weights", pt, "-o", built, "-q", *G.cli_flags(case.flags))
    assert_same_file_but_provenance(exported, built)


def test_export_with_past_writes_the_file_the_command_writes(cases, tmp_path, run_cli):
    case = cases["lucid_causal_heads2"]
    m = case.module()
    pt = tmp_path / "weights.pt"
    torch.save(m.state_dict(), pt)
    exported, built = tmp_path / "export.onnx", tmp_path / "build.onnx"
    result = gmlp_onnx.export(m, exported, with_past="static", opset=21)
    assert result.opset == 21
    run_cli("build", "--weights", pt, "-o", built, "-q", "--with-past", "static", "--opset", "21",
            *G.cli_flags(case.flags))
    assert_same_file_but_provenance(exported, built)


# ---------------------------------------------------------------------------------------
# 3. bf16 modules, non-contiguous tensors, parameters that require grad


def test_a_bf16_module_matches_the_f32_module_of_its_rounded_weights(cases, tmp_path, ort_run):
    case = cases["lucid_shift_causal"]
    m32 = case.module()
    with torch.no_grad():
        for p in m32.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    mbf = copy.deepcopy(m32).to(torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in mbf.parameters())
    path = tmp_path / "bf16.onnx"
    gmlp_onnx.export(mbf, path)
    check_against_module(path, mbf, case, ort_run, reference=m32)
    # Against the bf16 module's own (bf16 arithmetic) outputs: within bf16 rounding.
    x = case.inputs(seed=3)
    err = G.rel_error(ort_run(path, {case.input_name: x})[0], G.run_module(mbf, x))
    assert err <= 5e-2, err
    check_validate(path, m32, type(m32).__qualname__)


def test_non_contiguous_offset_and_broadcast_parameters_export_as_their_values(cases, tmp_path, ort_run):
    case = cases["lucid_amlp"]
    m = case.module()
    block = m.layers[0].fn.fn.fn
    w = block.proj_in[0].weight
    w.data = w.data.t().contiguous().t()  # transposed strides
    out = block.proj_out.weight
    big = torch.zeros(out.shape[0] + 3, out.shape[1] * 2)
    big[3:, ::2] = out.data
    out.data = big[3:, ::2]  # an offset and a step
    norm = m.layers[1].fn.norm
    norm.bias.data = torch.tensor([0.125]).expand(norm.bias.shape[0])  # stride 0
    assert not w.is_contiguous() and not out.is_contiguous() and norm.bias.stride() == (0,)
    assert all(p.requires_grad for p in m.parameters())
    path = tmp_path / "strided.onnx"
    gmlp_onnx.export(m, path)
    check_against_module(path, m, case, ort_run)
    # The same file as from contiguous copies of the same values.
    plain = copy.deepcopy(m)
    for p in plain.parameters():
        p.data = p.data.contiguous()
    again = tmp_path / "plain.onnx"
    gmlp_onnx.export(plain, again)
    assert_same_file_but_provenance(path, again)


def test_parameters_that_require_grad_or_not_export_alike(cases, tmp_path, ort_run):
    case = cases["gpt_heads2_sigmoid"]
    m = case.module()
    assert all(p.requires_grad for p in m.parameters())
    a = tmp_path / "grad.onnx"
    gmlp_onnx.export(m, a)
    check_against_module(a, m, case, ort_run)
    for i, p in enumerate(m.parameters()):
        p.requires_grad_(i % 2 == 0)
    b = tmp_path / "mixed.onnx"
    gmlp_onnx.export(m, b)
    assert_same_file_but_provenance(a, b)
    assert all(p.grad is None for p in m.parameters())


# ---------------------------------------------------------------------------------------
# 4. validate against the module


def test_validate_fails_with_a_report_when_the_module_changed_after_export(cases, tmp_path):
    case = cases["lucid_causal_heads2"]
    m = case.module()
    path = tmp_path / "m.onnx"
    gmlp_onnx.export(m, path)
    check_validate(path, m, type(m).__qualname__)
    with torch.no_grad():
        m.to_logits[1].weight[0].add_(0.5)
    with pytest.raises(gmlp_onnx.ValidationError) as e:
        gmlp_onnx.validate(path, reference=m)
    assert isinstance(e.value, gmlp_onnx.GmlpOnnxError)
    assert str(e.value) and "\n" not in str(e.value)
    assert e.value.report is not None
    assert e.value.report.passed is False
    # The runtimes still agree with each other; the pairs with the module do not.
    worst = e.value.report.worst()
    assert any(v > 1e-4 for k, v in worst.items() if "gMLP" in k), worst


def test_validate_without_reference_compares_the_runtimes(cases, tmp_path):
    m = cases["timm_gmlp"].module()
    path = tmp_path / "m.onnx"
    gmlp_onnx.export(m, path)
    report = gmlp_onnx.validate(path)
    assert report.passed, report.text
    assert any("tract" in k and "ort-cpu" in k for k in report.worst()), report.worst()
    assert report.data["pass"] is True


# ---------------------------------------------------------------------------------------
# 7. Errors


def test_a_module_that_is_no_gmlp_is_refused_and_nothing_is_written(tmp_path):
    path = tmp_path / "linear.onnx"
    before = G.folder_listing(tmp_path)
    with pytest.raises(gmlp_onnx.GmlpOnnxError) as e:
        gmlp_onnx.export(torch.nn.Linear(4, 4), path)
    assert isinstance(e.value, ValueError)
    assert str(e.value) and "\n" not in str(e.value)
    assert not path.exists()
    assert G.folder_listing(tmp_path) == before


def test_a_keyword_that_contradicts_the_module_is_refused(cases, tmp_path):
    m = cases["lucid_causal_heads2"].module()
    path = tmp_path / "m.onnx"
    with pytest.raises(gmlp_onnx.ModuleMismatchError) as e:
        gmlp_onnx.export(m, path, causal=False)
    assert isinstance(e.value, gmlp_onnx.GmlpOnnxError) and isinstance(e.value, ValueError)
    assert "causal" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(gmlp_onnx.ModuleMismatchError):
        gmlp_onnx.export(cases["lucid_act_tanh"].module(), path, gate_act="sigmoid")
    assert not path.exists()
    # Saying what the module says is fine.
    gmlp_onnx.export(m, path, causal=True)
    assert path.is_file()


def test_an_unknown_keyword_is_refused(cases, tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(gmlp_onnx.GmlpOnnxError) as e:
        gmlp_onnx.export(cases["lucid_mlm"].module(), path, no_such_flag=1)
    assert "no_such_flag" in str(e.value) and "\n" not in str(e.value)
    assert not path.exists()


def test_a_missing_checkpoint_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        gmlp_onnx.export(tmp_path / "missing.pt", tmp_path / "m.onnx")
    assert isinstance(e.value, gmlp_onnx.GmlpOnnxError)
    assert "\n" not in str(e.value)
    assert G.folder_listing(tmp_path) == []


def test_other_sources_are_refused_at_once(tmp_path):
    with pytest.raises(gmlp_onnx.UnsupportedModuleError):
        gmlp_onnx.export(42, tmp_path / "m.onnx")
    assert G.folder_listing(tmp_path) == []


def test_an_opset_outside_the_supported_range_is_out_of_range(cases, tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(gmlp_onnx.OutOfRangeError) as e:
        gmlp_onnx.export(cases["lucid_mlm"].module(), path, opset=12)
    assert isinstance(e.value, gmlp_onnx.InvalidArgumentError) and isinstance(e.value, ValueError)
    assert "opset 12" in str(e.value) and "\n" not in str(e.value)
    assert not path.exists()


def test_a_file_whose_input_has_an_unread_element_type_is_unsupported(tmp_path):
    # A file of another producer, made with onnx's own helpers: one bool input.
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["flags"], ["out"])],
        "flags",
        [helper.make_tensor_value_info("flags", TensorProto.BOOL, [2])],
        [helper.make_tensor_value_info("out", TensorProto.BOOL, [2])],
    )
    path = tmp_path / "flags.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(gmlp_onnx.UnsupportedError) as e:
        gmlp_onnx.validate(path)
    assert isinstance(e.value, gmlp_onnx.GmlpOnnxError) and isinstance(e.value, ValueError)
    assert "flags" in str(e.value) and "bool" in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------
# 8. Atomic replacement


def test_an_existing_file_is_replaced_atomically_and_kept_when_export_fails(cases, tmp_path, ort_run):
    case = cases["lucid_mlm"]
    m = case.module()
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old contents")
    gmlp_onnx.export(m, path)
    assert G.folder_listing(tmp_path) == ["m.onnx"]
    check_against_module(path, m, case, ort_run)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    gmlp_onnx.export(m, fresh / "m.onnx")
    assert_same_file_but_provenance(path, fresh / "m.onnx")
    # A failing export leaves the existing file as it was, and nothing beside it.
    old = path.read_bytes()
    with pytest.raises(gmlp_onnx.GmlpOnnxError):
        gmlp_onnx.export(torch.nn.Linear(4, 4), path)
    with pytest.raises(gmlp_onnx.ModuleMismatchError):
        gmlp_onnx.export(cases["lucid_causal_heads2"].module(), path, causal=False)
    assert path.read_bytes() == old
    assert G.folder_listing(tmp_path) == ["fresh", "m.onnx"]


# ---------------------------------------------------------------------------------------
# 9. inspect


@pytest.mark.parametrize("name", ["lucid_amlp", "timm_gmlp"])
def test_inspect_is_the_commands_json(cases, name, tmp_path, run_cli):
    path = tmp_path / "m.onnx"
    gmlp_onnx.export(cases[name].module(), path)
    info = gmlp_onnx.inspect(path)
    assert isinstance(info, dict) and info
    assert info == json.loads(run_cli("inspect", "--json", path))
    assert gmlp_onnx.inspect(str(path)) == info


def test_export_result_describes_the_file(cases, tmp_path):
    m = cases["lucid_causal_heads2"].module()
    path = tmp_path / "m.onnx"
    r = gmlp_onnx.export(m, path, with_past="static")
    assert r.path == os.fspath(path)
    assert r.config and isinstance(r.config, dict)
    assert r.target and r.mode and r.opset >= 13
    assert str(path) in r.summary or os.path.basename(path) in r.summary
    assert r.parameters > 0
    assert r.mode != gmlp_onnx.export(m, tmp_path / "plain.onnx").mode  # with past state vs without


def test_messages_name_settings_as_keywords(cases, tmp_path):
    """A refusal the command words with flags (`--eos-token-id applies to causal token
    models`) names the keyword instead, and writes nothing."""
    m = cases["timm_gmlp"].module()
    with pytest.raises(gmlp_onnx.OptionConflictError) as e:
        gmlp_onnx.export(m, tmp_path / "m.onnx", eos_token_id=1)
    assert str(e.value) == "invalid argument: eos_token_id applies to causal token models"
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("name", ["tiny_gmlp", "tiny_amlp"])
def test_a_gmlp_tinygrad_state_dict_of_numpy_arrays_matches_tinygrads_outputs(name, tmp_path, ort_run):
    """gmlp-tinygrad's model through its state dict (as numpy arrays, the way
    `nn.state.get_state_dict` gives them), against the outputs tinygrad itself wrote
    (fixtures/NAME/io.safetensors, scripts/make_fixtures.py)."""
    from safetensors.numpy import load_file

    folder = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", name)
    state = load_file(os.path.join(folder, "model.safetensors"))
    io = load_file(os.path.join(folder, "io.safetensors"))
    flags = json.load(open(os.path.join(folder, "meta.json")))["flags"]
    path = tmp_path / f"{name}.onnx"
    gmlp_onnx.export(state, path, **flags)
    got = ort_run(path, {"inputs_embeds": io["inputs_embeds"]})[0]
    want = io["last_hidden_state"]
    assert G.rel_error(got, want) <= BOUND


def test_the_onnxruntime_target_writes_fused_kernels_or_refuses_what_they_cannot_express(
    cases, ort_run, tmp_path
):
    # An aMLP MLM and a causal model with heads: ONNX Runtime's fused kernels, the module's
    # own outputs within the bound (any length for the causal one).
    import onnx

    for name in ("lucid_amlp", "lucid_causal_heads2"):
        case = cases[name]
        m = case.module()
        path = tmp_path / f"{name}.onnx"
        r = gmlp_onnx.export(m, path, target="onnxruntime")
        assert r.target == "onnxruntime"
        ops = {n.op_type for n in onnx.load(str(path)).graph.node}
        assert "SkipLayerNormalization" in ops, (name, sorted(ops))
        check_against_module(path, m, case, ort_run)
    # f16 weights are not in those kernels: refused, naming it, and nothing written.
    path = tmp_path / "f16.onnx"
    with pytest.raises(gmlp_onnx.InvalidArgumentError) as e:
        gmlp_onnx.export(cases["lucid_mlm"].module(), path, target="onnxruntime", dtype="f16")
    assert "do not cover f16" in str(e.value) and "\n" not in str(e.value)
    assert "target" in str(e.value) and "--target" not in str(e.value)
    assert not path.exists()
