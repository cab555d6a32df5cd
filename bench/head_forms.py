"""The vocabulary head of a decoding step in each weight form, side by side: one node (or the
`int8` form's node chain) multiplying one token's hidden state [1, K] by a [K, N] head
(amlp-base's tied 32000 x 512 embedding by default), ONNX Runtime CPU, interleaved runs,
so that the forms share the machine's moments. Forms:
  f32                 MatMul on the f32 weight
  dynamic-int8        DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul, per-column
                      int8 scales (`--dtype int8`'s head, and int4's before 8-bit blocks)
  nbits8-bB, nbits4-bB  com.microsoft.MatMulNBits, B-input blocks, accuracy level 4, the
                      scale rule of src/onnx/nbits.rs (m / -2^(bits-1), rounded to f16)
Prints a Markdown table: median microseconds per run, weight MB read, and the max-norm error
max|y - y_f32| / max|y_f32| on one seeded input (weights: seeded normal, std 0.05).

Usage: python bench/head_forms.py [--k 512] [--n 32000] [--runs 200] [--threads 2]
Test/bench helper only: needs onnxruntime, onnx and numpy.
"""
import argparse
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inits, k, n):
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    ops = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(g, opset_imports=ops, ir_version=8)


def nbits(w, bits, block):
    """MatMulNBits of `w` [K, N] as gmlp-onnx writes it (symmetric, f16-exact scales)."""
    k, n = w.shape
    kb = -(-k // block)
    wt = np.zeros((n, kb * block), np.float32)
    wt[:, :k] = w.T
    wt = wt.reshape(n, kb, block)
    m = np.take_along_axis(wt, np.abs(wt).argmax(-1)[..., None], -1)
    s = (m / -(1 << (bits - 1))).astype(np.float16).astype(np.float32)
    s[s == 0] = 1
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = (np.clip(np.round(wt / s), lo, hi).astype(np.int32) - lo).astype(np.uint8)
    if bits == 4:
        q = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    node = helper.make_node("MatMulNBits", ["x", "B", "S"], ["y"], domain="com.microsoft", K=k,
                            N=n, bits=bits, block_size=block, accuracy_level=4)
    inits = [numpy_helper.from_array(q, "B"), numpy_helper.from_array(s.reshape(n, kb), "S")]
    return model([node], inits, k, n), q.nbytes + 4 * n * kb


def dynamic_int8(w):
    k, n = w.shape
    s = (np.abs(w).max(0) / 127).astype(np.float32)
    s[s == 0] = 1
    q = np.round(w / s).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "Q", "xz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "S"], ["scale"]),
             helper.make_node("Mul", ["accf", "scale"], ["y"])]
    inits = [numpy_helper.from_array(q, "Q"), numpy_helper.from_array(s, "S")]
    return model(nodes, inits, k, n), q.nbytes + 4 * n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--n", type=int, default=32000)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((a.k, a.n)) * 0.05).astype(np.float32)
    forms = {"f32": (model([helper.make_node("MatMul", ["x", "W"], ["y"])],
                           [numpy_helper.from_array(w, "W")], a.k, a.n), w.nbytes),
             "dynamic-int8": dynamic_int8(w)}
    for bits, block in [(8, 32), (8, 64), (8, 128), (4, 32), (4, 128)]:
        forms[f"nbits{bits}-b{block}"] = nbits(w, bits, block)
    sessions = {}
    for name, (m, _) in forms.items():
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        # Several sessions side by side: idle threads must not spin while another runs.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[name] = ort.InferenceSession(m.SerializeToString(), so,
                                              providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, a.k)).astype(np.float32)
    ref = x @ w
    times = {name: [] for name in sessions}
    for _ in range(a.runs):
        for name, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, {"x": x})
            times[name].append(1e6 * (time.perf_counter() - t0))
    print(f"Head [1, {a.k}] x [{a.k}, {a.n}], ONNX Runtime {ort.__version__} CPU, "
          f"{a.threads} threads, median of {a.runs} interleaved runs.\n")
    print("| form | weight MB read | median us | vs dynamic-int8 | max-norm error vs f32 |")
    print("|---|---|---|---|---|")
    base = float(np.median(times["dynamic-int8"]))
    for name, s in sessions.items():
        y = s.run(None, {"x": x})[0]
        err = float(np.abs(y - ref).max() / np.abs(ref).max())
        t = float(np.median(times[name]))
        print(f"| {name} | {forms[name][1] / 1e6:.1f} | {t:.0f} | {t / base:.2f} | {err:.1e} |")


if __name__ == "__main__":
    main()
