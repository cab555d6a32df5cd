"""gmlp_onnx beside the onnxruntime package in one process (acceptance item 6): ONNX
Runtime imported and run first, then export / validate / Generator(runtime="ort-cpu"),
all giving the results they give alone, and the process exits cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import gmlp_onnx  # noqa: F401  (the extension must be built for this test)

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {here!r})
    import numpy as np
    import onnx
    from onnx import helper, TensorProto
    import onnxruntime as ort

    # ONNX Runtime first: a session created and run before gmlp_onnx is imported.
    add = helper.make_model(
        helper.make_graph(
            [helper.make_node("Add", ["a", "b"], ["c"])],
            "add",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("a", "b")],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    add.ir_version = 8
    first = ort.InferenceSession(add.SerializeToString(), providers=["CPUExecutionProvider"])
    assert first.run(None, {{"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}})[0].tolist() == [2.0, 2.0]

    import torch
    import gmlp_onnx
    import gmlp_models as G

    case = G.CASES["lucid_causal_heads2"]
    m = case.module()
    folder = sys.argv[1]
    plain, past = folder + "/plain.onnx", folder + "/past.onnx"
    gmlp_onnx.export(m, plain)
    gmlp_onnx.export(m, past, with_past="static")

    x = case.inputs(seed=1)
    got = ort.InferenceSession(plain, providers=["CPUExecutionProvider"]).run(None, {{"input_ids": x}})[0]
    err = G.rel_error(got, G.run_module(m, x))
    assert err <= 1e-5, err

    report = gmlp_onnx.validate(plain, reference=m)
    assert report.passed, report.text
    report = gmlp_onnx.validate(past, reference=m)
    assert report.passed, report.text

    prompt = [3, 17, 5]
    want = G.greedy(m, prompt, 6)
    gen = gmlp_onnx.Generator(past, runtime="ort-cpu")
    assert gen.generate(prompt, max_new_tokens=6) == want, (gen.generate(prompt, max_new_tokens=6), want)
    # The first session still runs after gmlp_onnx used ONNX Runtime.
    assert first.run(None, {{"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}})[0].tolist() == [2.0, 2.0]
    del gen
    print("ok")
    """
)


def test_onnxruntime_first_then_gmlp_onnx_in_one_process(tmp_path):
    script = SCRIPT.format(here=HERE)
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert p.stdout.strip().splitlines()[-1] == "ok", p.stdout
    for bad in ("Segmentation", "abort", "Abort", "core dumped", "double free", "terminate called"):
        assert bad not in p.stderr, p.stderr
