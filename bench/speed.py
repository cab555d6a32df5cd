"""CPU speed of the f32 graph and of `--dtype int8` (docs/speed.md), side by side in one run.

Prints Markdown (the "CPU speed" sections of BENCHMARKS.md):
  1. f32 graph, this build vs a baseline binary (the graph before the fusion-friendly changes),
     every preset, ONNX Runtime CPU latency with runs interleaved (bench/ab.py), plus tract on
     two presets;
  2. ONNX Runtime kernel time per op type (after its fusions), baseline vs this build
     (bench/profile_ops.py), amlp-base --layers 6, n = 512, batch 1;
  3. int8 vs f32 vs `onnxruntime.quantization.quantize_dynamic` (per-channel int8) of the same
     f32 file: ONNX Runtime and tract latency, load time, file size, logits error vs f32,
     amlp-base n = 512 and gmlp-b16 (batch 1);
  4. the g-mlp-pytorch aMLP peer (bench/make_peer.py): ours f32 / int8 vs torch.onnx.export,
     each also after `onnxruntime.transformers.optimizer` (model_type bert, opt_level 1).
Usage: python bench/speed.py --baseline-exe OLD_GMLP_ONNX [--peer-python PY] [--work DIR]
       [--runs 5] [--quick]
Needs onnxruntime and numpy in this Python; the peer needs torch, g-mlp-pytorch, safetensors.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_ops import make_inputs, profile  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXE = os.path.join(ROOT, "target", "release", "gmlp-onnx")
PRESETS = ["gmlp-ti16", "gmlp-s16", "gmlp-b16", "gmlp-base", "amlp-base", "gmlp-large", "amlp-large",
           "gmlp-xlarge"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(cmd):
    log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    t0 = time.perf_counter()
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return s, 1e3 * (time.perf_counter() - t0)


def interleaved(models, runs, batch=1):
    """ONNX Runtime medians (ms), load times (ms) and outputs, runs interleaved A B C A B C."""
    sessions = [session(m) for m in models]
    feeds = make_inputs(sessions[0][0], batch)
    outs = [s.run(None, feeds)[0] for s, _ in sessions]
    times = [[] for _ in models]
    for _ in range(runs):
        for k, (s, _) in enumerate(sessions):
            t0 = time.perf_counter()
            s.run(None, feeds)
            times[k].append(1e3 * (time.perf_counter() - t0))
    loads = [load for _, load in sessions]
    del sessions
    global LAST_MINS
    LAST_MINS = [min(t) for t in times]
    return [float(np.median(t)) for t in times], loads, outs


LAST_MINS = []  # min latency (ms) of each model in the last interleaved() call


def tract(model, runs, batch=1):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        report = f.name
    try:
        sh([EXE, "validate", model, "--runtimes", "tract", "--batch", str(batch), "--bench", str(runs),
            "--report", report])
        r = json.load(open(report))["runtimes"][0]
        return r["bench"]["median_ms"], r["load_ms"]
    finally:
        os.unlink(report)


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def quantize_dynamic(src, dst):
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as qd
    qd(src, dst, weight_type=QuantType.QInt8, per_channel=True)


def size_mb(path):
    return sum(os.path.getsize(p) for p in (path, path + ".data") if os.path.exists(p)) / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline-exe", required=True)
    ap.add_argument("--peer-python", default=None)
    ap.add_argument("--work", default=None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default="f32,profile,int8,peer", help="comma-separated subset to run")
    a = ap.parse_args()
    sections = set(a.sections.split(","))
    work = a.work or tempfile.mkdtemp(prefix="gmlp-speed-")
    os.makedirs(work, exist_ok=True)
    runs = a.runs

    def say(line=""):
        print(line, flush=True)

    # 1. f32 before / after, every preset.
    if "f32" in sections:
        f32_section(a, work, runs, say)
    if "profile" in sections:
        profile_section(a, work, runs, say)
    if "int8" in sections:
        int8_section(a, work, runs, say)
    if "peer" in sections:
        peer_section(a, work, runs, say)


def f32_section(a, work, runs, say):
    say("### f32 graph: this build vs the previous graph (ONNX Runtime CPU, batch 1, runs interleaved)")
    say()
    say("| preset | n | before ms (median) | after ms (median) | after / before (median) | after / before (min) | max rel after vs before |")
    say("|---|---|---|---|---|---|---|")
    for p in (["gmlp-ti16", "amlp-base"] if a.quick else PRESETS):
        old, new = os.path.join(work, f"{p}.old.onnx"), os.path.join(work, f"{p}.new.onnx")
        flags = ["--layers", "24"] if p == "gmlp-xlarge" else []
        sh([a.baseline_exe, "build", "--preset", p, *flags, "-o", old, "-q"])
        sh([EXE, "build", "--preset", p, *flags, "-o", new, "-q"])
        med, _, outs = interleaved([old, new], runs)
        n = 196 if "16" in p else 512
        name = p + (" (24 of 144 blocks)" if flags else "")
        mins = LAST_MINS
        say(f"| {name} | {n} | {med[0]:.1f} | {med[1]:.1f} | {med[1] / med[0]:.3f} | {mins[1] / mins[0]:.3f} | "
            f"{rel(outs[1], outs[0]):.1e} |")
        for f in (old, new):
            for g in (f, f + ".data"):
                if os.path.exists(g):
                    os.unlink(g)
    say()
    say("tract, same files (median of `validate --bench`, before then after):")
    say()
    say("| preset | before ms | after ms | after / before |")
    say("|---|---|---|---|")
    for p, flags in (("gmlp-b16", []), ("amlp-base", ["--layers", "6"])):
        old, new = os.path.join(work, f"{p}.old.onnx"), os.path.join(work, f"{p}.new.onnx")
        sh([a.baseline_exe, "build", "--preset", p, *flags, "-o", old, "-q"])
        sh([EXE, "build", "--preset", p, *flags, "-o", new, "-q"])
        t_old = [tract(old, runs)[0], tract(old, runs)[0]]
        t_new = [tract(new, runs)[0], tract(new, runs)[0]]
        b, n_ = min(t_old), min(t_new)
        say(f"| {p}{' --layers 6' if flags else ''} | {b:.0f} | {n_:.0f} | {n_ / b:.3f} |")
    say()



def profile_section(a, work, runs, say):
    say("### ONNX Runtime kernel time per op type (amlp-base --layers 6, n = 512, batch 1)")
    say()
    old, new = os.path.join(work, "amlp6.old.onnx"), os.path.join(work, "amlp6.new.onnx")
    q8 = os.path.join(work, "amlp6.int8.onnx")
    sh([a.baseline_exe, "build", "--preset", "amlp-base", "--layers", "6", "-o", old, "-q"])
    sh([EXE, "build", "--preset", "amlp-base", "--layers", "6", "-o", new, "-q"])
    sh([EXE, "build", "--preset", "amlp-base", "--layers", "6", "--dtype", "int8", "-o", q8, "-q"])
    for label, m in (("before", old), ("after (f32)", new), ("int8", q8)):
        r = profile(m, runs, 2, 1)
        say(f"{label}: {r['kernel_us_per_run'] / 1e3:.1f} ms kernel time per run; " + ", ".join(
            f"{o['op']} {100 * o['share']:.1f}% ({o['nodes']})" for o in r["ops"]))
        say()



def int8_section(a, work, runs, say):
    say("### int8 vs f32 vs quantize_dynamic (batch 1; ONNX Runtime runs interleaved)")
    say()
    say("| model | form | file MB | ORT load ms | ORT ms (median) | ORT ms (min) | vs f32 (median) | tract load ms | tract ms | logits max rel err vs f32 |")
    say("|---|---|---|---|---|---|---|---|---|---|")
    for p in (["amlp-base"] if a.quick else ["amlp-base", "gmlp-b16"]):
        f32 = os.path.join(work, f"{p}.f32.onnx")
        i8 = os.path.join(work, f"{p}.int8.onnx")
        qd = os.path.join(work, f"{p}.qdyn.onnx")
        sh([EXE, "build", "--preset", p, "-o", f32, "-q"])
        sh([EXE, "build", "--preset", p, "--dtype", "int8", "-o", i8, "-q"])
        quantize_dynamic(f32, qd)
        med, loads, outs = interleaved([f32, i8, qd], runs)
        mins = LAST_MINS
        for k, (form, m) in enumerate((("f32", f32), ("int8 (ours)", i8), ("quantize_dynamic", qd))):
            t_ms, t_load = tract(m, 2) if p == "gmlp-b16" or form != "quantize_dynamic" else (None, None)
            err = "–" if k == 0 else f"{rel(outs[k], outs[0]):.1e}"
            tr = f"{t_load:.0f} | {t_ms:.0f}" if t_ms is not None else "– | –"
            say(f"| {p} | {form} | {size_mb(m):.0f} | {loads[k]:.0f} | {med[k]:.1f} | {mins[k]:.1f} | "
                f"{med[0] / med[k]:.2f}x | {tr} | {err} |")
        say(f"| {p} | int8 / quantize_dynamic latency | | | {med[1] / med[2]:.2f} | {mins[1] / mins[2]:.2f} | | | | |")
        for m in (f32, i8, qd):
            os.unlink(m)
    say()



def peer_section(a, work, runs, say):
    say("### Peer: g-mlp-pytorch aMLP (d 512, f 3072, attention 64, n = 256, 36 blocks), batch 1")
    say()
    if not a.peer_python:
        say("Skipped: no --peer-python.")
        return
    peer_dir = os.path.join(work, "peer")
    sh([a.peer_python, os.path.join(ROOT, "bench", "make_peer.py"), peer_dir])
    ck = os.path.join(peer_dir, "amlp.safetensors")
    models = {
        "torch.onnx.export (opset 17)": os.path.join(peer_dir, "peer.onnx"),
        "ours, previous graph": os.path.join(peer_dir, "ours-old.onnx"),
        "ours f32": os.path.join(peer_dir, "ours.onnx"),
        "ours f32, --target onnxruntime": os.path.join(peer_dir, "ours-onnxruntime.onnx"),
        "ours int8": os.path.join(peer_dir, "ours-int8.onnx"),
    }
    sh([a.baseline_exe, "build", "--weights", ck, "-o", models["ours, previous graph"], "-q"])
    sh([EXE, "build", "--weights", ck, "-o", models["ours f32"], "-q"])
    sh([EXE, "build", "--weights", ck, "--target", "onnxruntime", "-o",
        models["ours f32, --target onnxruntime"], "-q"])
    sh([EXE, "build", "--weights", ck, "--dtype", "int8", "-o", models["ours int8"], "-q"])
    from onnxruntime.transformers import optimizer
    for name in ("torch.onnx.export (opset 17)", "ours f32"):
        dst = models[name][:-5] + "-opt.onnx"
        optimizer.optimize_model(models[name], model_type="bert", num_heads=0, hidden_size=0,
                                 opt_level=1).save_model_to_file(dst)
        models[name + " + transformers optimizer"] = dst
    names = list(models)
    inputs = dict(np.load(os.path.join(peer_dir, "inputs.npz")))
    expected = np.load(os.path.join(peer_dir, "expected.npz"))["logits"]
    sessions = [session(models[n])[0] for n in names]
    outs = [s.run(None, inputs)[0] for s in sessions]
    times = [[] for _ in names]
    for _ in range(runs):
        for k, s in enumerate(sessions):
            t0 = time.perf_counter()
            s.run(None, inputs)
            times[k].append(1e3 * (time.perf_counter() - t0))
    med = [float(np.median(t)) for t in times]
    mins = [min(t) for t in times]
    base = med[names.index("torch.onnx.export (opset 17)")]
    base_opt = med[names.index("torch.onnx.export (opset 17) + transformers optimizer")]
    kb, ko = names.index("torch.onnx.export (opset 17)"), names.index("torch.onnx.export (opset 17) + transformers optimizer")
    say("| model | ONNX Runtime CPU ms (median) | (min) | / torch.onnx.export (median, min) | / export + optimizer (median, min) | max rel vs PyTorch |")
    say("|---|---|---|---|---|---|")
    for k, n in enumerate(names):
        say(f"| {n} | {med[k]:.1f} | {mins[k]:.1f} | {med[k] / base:.2f}, {mins[k] / mins[kb]:.2f} | "
            f"{med[k] / base_opt:.2f}, {mins[k] / mins[ko]:.2f} | {rel(outs[k], expected):.1e} |")
    say()


if __name__ == "__main__":
    main()
