"""The notebook walk on a GPU machine, in one process: onnxruntime-gpu imported first and a
CUDA InferenceSession run, then a g-mlp-pytorch module exported with gmlp_onnx, validated
against the module (tract, ort-cpu, ort-cuda), and generated with
Generator(runtime="ort-cuda") beside Generator(runtime="ort-cpu"): the tokens must be
equal; the step medians of both are printed; the process must exit cleanly (the caller
checks the exit status: 0).

Usage (where onnxruntime-gpu loads, ../shared/gpu/unpack.sh; torch and g-mlp-pytorch
installed, the wheel of this checkout installed):
  python bench/gpu_python.py [--layers 6] [--new-tokens 64] [--batch 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()

    # A notebook that used onnxruntime-gpu before gmlp_onnx: a CUDA session, run.
    import onnx
    from onnx import helper, TensorProto

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    print("onnxruntime", ort.__version__, session.get_providers())
    session.run(None, {"x": np.array([-1, 2, -3, 4], np.float32)})

    import torch
    from g_mlp_pytorch import gMLP

    import gmlp_onnx

    torch.manual_seed(0)
    m = gMLP(num_tokens=32000, dim=512, depth=a.layers, seq_len=512, ff_mult=6, attn_dim=64, causal=True).eval()
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/lm.onnx"
        r = gmlp_onnx.export(m, path, with_past="static")
        print(r.summary)
        rep = gmlp_onnx.validate(path, reference=m, runtimes="tract,ort-cpu,ort-cuda", batch=1)
        print(rep.worst())
        prompts = [[(7 * b + 3 * i) % 32000 for i in range(64)] for b in range(a.batch)]
        tokens = {}
        steps = {}
        for runtime in ("ort-cpu", "ort-cuda"):
            gen = gmlp_onnx.Generator(path, runtime=runtime)
            print(runtime, gen.note)
            tokens[runtime] = gen.generate(prompts, max_new_tokens=a.new_tokens)
            stamps = [time.perf_counter()]
            for _ in gen.stream(prompts, max_new_tokens=a.new_tokens):
                stamps.append(time.perf_counter())
            gaps = [1e3 * (y - x) for x, y in zip(stamps[2:], stamps[3:])]
            steps[runtime] = statistics.median(gaps)
            print(f"{runtime}: step median {steps[runtime]:.3f} ms over {len(gaps)} steps")
        same = tokens["ort-cpu"] == tokens["ort-cuda"]
        print("tokens equal:", same)
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
