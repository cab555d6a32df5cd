"""Which ONNX form for weight-only int4 (and int8): com.microsoft MatMulNBits, or opset-21
blocked DequantizeLinear + MatMul? Measured side by side in one run, ONNX Runtime CPU.

The f32 amlp-base `--layers 6 --causal` files (with-past and variable-length, opset 21) are
built by the gmlp-onnx binary; this script then rewrites every MatMul with a constant weight
(proj_in halves, q/k/v, attention out, proj_out) and the tied vocabulary head (h · Eᵀ) in
each candidate form, with the same block quantization (block 32 along K, per-block scale
m / −2^(bits−1) for the block's largest-magnitude value m, rounded to f16, no zero point):
  f32           the file as built
  nbits4        MatMulNBits bits=4 (accuracy_level 0: A stays f32)
  nbits4-acc4   MatMulNBits bits=4, accuracy_level 4 (A quantized to int8 per block inside)
  dq4           DequantizeLinear(int4 [K, N], scale [K/32, N], axis 0, block_size 32) + MatMul
  nbits4+hdyn8  nbits4, the vocabulary head in today's dynamic int8 form
  nbits4-acc4+hdyn8
  nbits8        MatMulNBits bits=8 (weight-only int8)
  nbits8-acc4   MatMulNBits bits=8, accuracy_level 4
  dq8           DequantizeLinear(int8, blocked) + MatMul
  int8-dynamic  `gmlp-onnx build --dtype int8` (today's dynamic quantization)
and times (a) one decoding step of the with-past file after a 448-token past (sequence 1),
(b) one whole forward of the variable-length file at n = 512; 2 intra-op threads, the
sessions' runs interleaved (A B C … A B C …). Also prints the weight bytes a step reads and
the max relative logits error vs f32 of the whole forward.

With `--spatial` it answers instead whether the spatial projection W · LN(z2) should be
int4 too: on the fixed-length file (n = 512) it times whole forwards of nbits4-acc4 with
the spatial MatMul in f32 (W gathered from its Toeplitz vector) against the same file with
it as (uᵀ · Wᵀ)ᵀ, Wᵀ [n, n] quantized per block of 32 along its input (token) axis,
as MatMulNBits (the constant must be MatMulNBits' second operand). A decoding step reads
one row of W (n values), which quantization cannot make cheaper.

With `--static FILE` it times instead one decoding step of a static-state with-past file
(inputs `position` [batch] and fixed-size `past_*` [1, n, ·], outputs `present_*` bound onto
the same buffers through I/O binding, so the state is written in place) as built and
rewritten in the `--only` forms, sessions interleaved, at the past length `--past`.

Usage: python bench/int4_forms.py --exe target/release/gmlp-onnx [--work DIR] [--runs 40]
       [--forward-runs 5] [--threads 2] [--only f32,nbits4,...] [--spatial]
       [--static FILE --only f32,nbits4-acc4+hdyn8,nbits4-acc4,nbits8-acc4]
Bench helper only (onnx, onnxruntime, numpy: the project's .venv).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

CONFIG = ["--preset", "amlp-base", "--layers", "6", "--causal", "--opset", "21"]
BLOCK = 32


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def quantize(w_kn, bits):
    """Block quantization of W [K, N] along K: per (block, column) the scale is
    f16(m / -2^(bits-1)) for the signed value m of largest magnitude; codes
    q = clamp(round(w / s), -2^(bits-1), 2^(bits-1) - 1). Returns (q [K, N] int, s [K/32, N])."""
    k, n = w_kn.shape
    half = 2 ** (bits - 1)
    kp = -(-k // BLOCK) * BLOCK  # the last block padded with zeros
    w_kn = np.concatenate([w_kn, np.zeros((kp - k, n), np.float32)])
    blocks = w_kn.reshape(kp // BLOCK, BLOCK, n)
    idx = np.abs(blocks).argmax(axis=1)
    m = np.take_along_axis(blocks, idx[:, None, :], axis=1)[:, 0, :]
    s = (m / -half).astype(np.float16).astype(np.float32)
    s[s == 0] = 1.0
    q = np.clip(np.rint(blocks / s[:, None, :]), -half, half - 1).astype(np.int32)
    return q.reshape(kp, n), s


def nbits_inputs(name, w_kn, bits):
    """MatMulNBits B [N, K/32, 32·bits/8] (codes + 2^(bits-1), low nibble first) and scales [N, K/32]."""
    q, s = quantize(w_kn, bits)
    n = w_kn.shape[1]
    u = (q + 2 ** (bits - 1)).astype(np.uint8).T.reshape(n, -1, BLOCK)
    if bits == 4:
        u = (u[:, :, 0::2] | (u[:, :, 1::2] << 4)).astype(np.uint8)
    b = numpy_helper.from_array(np.ascontiguousarray(u), name + ".q")
    sc = numpy_helper.from_array(np.ascontiguousarray(s.T), name + ".scale")
    return b, sc


def dq_inputs(name, w_kn, bits):
    q, s = quantize(w_kn, bits)
    q = q[: w_kn.shape[0]]
    if bits == 4:
        # INT4 tensors pack two values per byte, low nibble first (onnx.numpy_helper does this).
        t = helper.make_tensor(name + ".q", TensorProto.INT4, list(q.shape), q.flatten().tolist())
    else:
        t = numpy_helper.from_array(q.astype(np.int8), name + ".q")
    return t, numpy_helper.from_array(s, name + ".scale")


def rewrite(src, dst, form):
    m = onnx.load(src)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    bits = 8 if form.startswith(("nbits8", "dq8")) else 4
    acc = 4 if "acc4" in form else 0
    head_dyn8 = form.endswith("+hdyn8")
    nodes, new_inits, drop = [], [], set()
    embed_t = None
    for nd in g.node:
        if nd.op_type == "Transpose" and nd.input[0] == "embed.weight":
            embed_t = nd.output[0]
            continue
        if nd.op_type != "MatMul":
            nodes.append(nd)
            continue
        a, b = nd.input
        if b in inits and len(inits[b].dims) == 2:
            w = numpy_helper.to_array(inits[b]).astype(np.float32)
            drop.add(b)
            wname = b
        elif b == embed_t:
            w = numpy_helper.to_array(inits["embed.weight"]).astype(np.float32).T.copy()
            wname = "embed.weight.transposed"
        else:
            nodes.append(nd)
            continue
        k, n = w.shape
        if head_dyn8 and nd.name.startswith("head/"):
            # The vocabulary head in today's dynamic int8 form (per-column int8 scales).
            sc = np.abs(w).max(axis=0) / 127
            sc[sc == 0] = 1
            q = np.clip(np.rint(w / sc), -127, 127).astype(np.int8)
            new_inits += [numpy_helper.from_array(q, wname + ".int8"),
                          numpy_helper.from_array(sc.astype(np.float32), wname + ".scale")]
            p = nd.name
            nodes += [
                helper.make_node("DynamicQuantizeLinear", [a], [p + "_xq", p + "_xs", p + "_xz"]),
                helper.make_node("Mul", [p + "_xs", wname + ".scale"], [p + "_s"]),
                helper.make_node("MatMulInteger", [p + "_xq", wname + ".int8", p + "_xz"],
                                 [p + "_acc"]),
                helper.make_node("Cast", [p + "_acc"], [p + "_accf"], to=TensorProto.FLOAT),
                helper.make_node("Mul", [p + "_accf", p + "_s"], list(nd.output), name=nd.name)]
        elif form.startswith("nbits"):
            qb, sc = nbits_inputs(wname, w, bits)
            new_inits += [qb, sc]
            nodes.append(helper.make_node(
                "MatMulNBits", [a, qb.name, sc.name], list(nd.output), name=nd.name,
                domain="com.microsoft", K=k, N=n, bits=bits, block_size=BLOCK,
                accuracy_level=acc))
        else:
            qt, sc = dq_inputs(wname, w, bits)
            new_inits += [qt, sc]
            deq = nd.name + "_dequant"
            nodes.append(helper.make_node("DequantizeLinear", [qt.name, sc.name], [deq],
                                          name=deq, axis=0, block_size=BLOCK))
            nodes.append(helper.make_node("MatMul", [a, deq], list(nd.output), name=nd.name))
    keep = [i for i in g.initializer if i.name not in drop]
    del g.initializer[:]
    g.initializer.extend(keep + new_inits)
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    if form.startswith("nbits"):
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(m, dst)


def spatial_int4(src, dst):
    """`src` with each block's spatial MatMul(W, u) as Transpose → MatMulNBits(Wᵀ) → Transpose."""
    m = onnx.load(src)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    consts = {n.output[0]: n for n in g.node if n.op_type == "Constant"}
    gathers = {n.output[0]: n for n in g.node if n.op_type == "Gather"}
    nodes = []
    for nd in g.node:
        if not nd.name.endswith("/sgu/spatial_matmul"):
            nodes.append(nd)
            continue
        gather = gathers[nd.input[0]]
        vec = numpy_helper.to_array(inits[gather.input[0]])
        index = numpy_helper.to_array(consts[gather.input[1]].attribute[0].t)
        w = vec[index]  # [n, n]
        qb, sc = nbits_inputs(nd.name, np.ascontiguousarray(w.T), 4)  # K = n tokens in
        n = w.shape[0]
        p = nd.name
        nodes += [
            helper.make_node("Transpose", [nd.input[1]], [p + "_ut"], perm=[0, 2, 1]),
            helper.make_node("MatMulNBits", [p + "_ut", qb.name, sc.name], [p + "_mt"],
                             domain="com.microsoft", K=n, N=n, bits=4, block_size=BLOCK,
                             accuracy_level=4),
            helper.make_node("Transpose", [p + "_mt"], list(nd.output), perm=[0, 2, 1]),
        ]
        g.initializer.extend([qb, sc])
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    onnx.save(m, dst)


def spatial_experiment(a, work):
    base = os.path.join(work, "fixed-f32.onnx")
    if not os.path.exists(base):
        subprocess.run([a.exe, "build", *CONFIG, "--fixed-seq", "-q", "-o", base], check=True)
    q = os.path.join(work, "fixed-nbits4-acc4.onnx")
    qs = os.path.join(work, "fixed-nbits4-acc4-spatial4.onnx")
    if not os.path.exists(q):
        rewrite(base, q, "nbits4-acc4")
    if not os.path.exists(qs):
        spatial_int4(q, qs)
    names = ["spatial f32", "spatial int4 (uᵀ·Wᵀ)ᵀ"]
    sessions = [session(p, a.threads) for p in (q, qs)]
    ids = {"input_ids": np.random.default_rng(0).integers(0, 32000, (1, 512), dtype=np.int64)}
    outs = [s.run(["logits"], ids)[0] for s in sessions]
    fwd = interleaved(sessions, [ids, ids], a.forward_runs)
    err = float(np.abs(outs[1] - outs[0]).max() / np.abs(outs[0]).max())
    print(f"amlp-base `--layers 6 --causal --fixed-seq --opset 21` as nbits4-acc4, ONNX Runtime "
          f"{ort.__version__} CPU, {a.threads} threads, batch 1, whole forward n = 512, median of "
          f"{a.forward_runs} interleaved runs.\n")
    print("| spatial projection | whole forward ms | vs f32 spatial | logits max rel diff |")
    print("|---|---|---|---|")
    for k, nm in enumerate(names):
        print(f"| {nm} | {fwd[k]:.1f} | {fwd[k] / fwd[0]:.2f} | {err if k else 0:.1e} |")


def static_experiment(a, work):
    """Steps of a static-state file and its rewrites, state bound in place (module docstring)."""
    forms = a.only.split(",")
    sessions = []
    for form in forms:
        path = a.static
        if form != "f32":
            path = os.path.join(work, f"static-{form}.onnx")
            if not os.path.exists(path):
                rewrite(a.static, path, form)
        s = session(path, a.threads)
        b = s.io_binding()
        rng = np.random.default_rng(0)
        state = {}
        for i in s.get_inputs():
            if i.name.startswith("past_"):
                v = rng.standard_normal((1, *i.shape[1:])).astype(np.float32)
                state[i.name] = ort.OrtValue.ortvalue_from_numpy(v)
                b.bind_ortvalue_input(i.name, state[i.name])
        b.bind_cpu_input("input_ids", np.array([[17]], np.int64))
        b.bind_cpu_input("position", np.array([a.past], np.int64))
        for o in s.get_outputs():
            if o.name.startswith("present_"):
                b.bind_ortvalue_output(o.name, state["past_" + o.name[len("present_"):]])
            else:
                b.bind_output(o.name)
        for _ in range(3):
            s.run_with_iobinding(b)
        sessions.append((form, s, b, weight_bytes_read_by_step(path)))
    times = {f: [] for f, *_ in sessions}
    for _ in range(a.runs):
        for form, s, b, _ in sessions:
            t0 = time.perf_counter()
            s.run_with_iobinding(b)
            times[form].append(1e3 * (time.perf_counter() - t0))
    print(f"{os.path.basename(a.static)}, ONNX Runtime {ort.__version__} CPU, {a.threads} threads, "
          f"one step at position {a.past}, state written in place (I/O binding), median of "
          f"{a.runs} interleaved runs.\n")
    print("| form | weight MB read per step | step ms (median) | min ms | vs f32 |")
    print("|---|---|---|---|---|")
    ref = float(np.median(times[forms[0]]))
    for form, _, _, mb in sessions:
        t = times[form]
        print(f"| {form} | {mb / 1e6:.1f} | {np.median(t):.2f} | {min(t):.2f} | "
              f"{np.median(t) / ref:.2f} |")


def session(path, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # Several sessions live side by side: idle intra-op threads must not spin on the 2 cores
    # while another session runs.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def step_feeds(s, past, rng):
    feeds = {}
    for i in s.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = np.array([[17]], dtype=np.int64)
        else:
            feeds[i.name] = rng.standard_normal((1, past, i.shape[2])).astype(np.float32)
    return feeds


def weight_bytes_read_by_step(path):
    """Bytes of every initializer, except the embedding table where only its `Gather` reads
    it (a step gathers one row); the f32 head reads the whole table (transposed)."""
    m = onnx.load(path, load_external_data=False)
    gather_only = all(n.op_type == "Gather" for n in m.graph.node if "embed.weight" in n.input)
    total = 0
    for t in m.graph.initializer:
        if t.name == "embed.weight" and gather_only:
            continue
        bits = {TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.INT8: 8,
                TensorProto.UINT8: 8, TensorProto.FLOAT: 32}[t.data_type]
        total += (int(np.prod(t.dims)) * bits + 7) // 8
    return total


def interleaved(sessions, feeds, runs):
    times = [[] for _ in sessions]
    for _ in range(runs):
        for k, (s, f) in enumerate(zip(sessions, feeds)):
            t0 = time.perf_counter()
            s.run(["logits"], f)
            times[k].append(1e3 * (time.perf_counter() - t0))
    return [float(np.median(t)) for t in times]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--forward-runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--past", type=int, default=448)
    ap.add_argument("--spatial", action="store_true")
    ap.add_argument("--static", default=None, help="a static-state with-past file")
    ap.add_argument("--only", default="f32,nbits4,nbits4-acc4,dq4,nbits8,nbits8-acc4,dq8,int8-dynamic")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="gmlp-int4-forms-")
    os.makedirs(work, exist_ok=True)
    if a.spatial:
        spatial_experiment(a, work)
        return
    if a.static:
        static_experiment(a, work)
        return
    forms = a.only.split(",")
    files = {}
    for kind, extra in (("past", ["--with-past"]), ("var", [])):
        base = os.path.join(work, f"{kind}-f32.onnx")
        if not os.path.exists(base):
            subprocess.run([a.exe, "build", *CONFIG, *extra, "-q", "-o", base], check=True)
        for form in forms:
            path = os.path.join(work, f"{kind}-{form}.onnx")
            if form == "f32":
                path = base
            elif not os.path.exists(path):
                if form == "int8-dynamic":
                    subprocess.run([a.exe, "build", *CONFIG, *extra, "--dtype", "int8", "-q",
                                    "-o", path], check=True)
                else:
                    log(f"rewriting {kind} as {form}")
                    rewrite(base, path, form)
            files[(kind, form)] = path
    rng = np.random.default_rng(0)
    # (a) one decoding step
    sessions = [session(files[("past", f)], a.threads) for f in forms]
    feeds0 = step_feeds(sessions[0], a.past, rng)
    feeds = [{i.name: feeds0[i.name] for i in s.get_inputs()} for s in sessions]
    for s, f in zip(sessions, feeds):
        s.run(["logits"], f)
    step = interleaved(sessions, feeds, a.runs)
    del sessions
    # (b) one whole forward at n = 512
    sessions = [session(files[("var", f)], a.threads) for f in forms]
    ids = {"input_ids": rng.integers(0, 32000, (1, 512), dtype=np.int64)}
    outs = [s.run(["logits"], ids)[0] for s in sessions]
    fwd = interleaved(sessions, [ids] * len(sessions), a.forward_runs)
    ref = outs[forms.index("f32")] if "f32" in forms else outs[0]
    print(f"amlp-base `--layers 6 --causal --opset 21`, ONNX Runtime {ort.__version__} CPU, "
          f"{a.threads} threads, batch 1; step: sequence 1 after a {a.past}-token past, median of "
          f"{a.runs} interleaved runs; whole forward: n = 512, median of {a.forward_runs}.\n")
    print("| form | weight MB read per step | step ms | step / f32 step | whole forward ms | "
          "forward / f32 | logits max rel err vs f32 |")
    print("|---|---|---|---|---|---|---|")
    i32 = forms.index("f32") if "f32" in forms else 0
    for k, f in enumerate(forms):
        mb = weight_bytes_read_by_step(files[("past", f)]) / 1e6
        err = float(np.abs(outs[k] - ref).max() / np.abs(ref).max())
        print(f"| {f} | {mb:.1f} | {step[k]:.2f} | {step[k] / step[i32]:.2f} | {fwd[k]:.1f} | "
              f"{fwd[k] / fwd[i32]:.2f} | {err:.1e} |")


if __name__ == "__main__":
    main()
