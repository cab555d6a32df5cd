"""The f32 graph of two builds of gmlp-onnx, every preset, side by side in ONNX Runtime CPU.

Checks the acceptance point of the f32 graph changes (docs/speed.md) "the f32 graph is at
most as slow as before on every preset": each preset is built (same --layers for both) by an
OLD and a NEW binary, both models are loaded together and run alternately in ABBA order (old
new new old ...), so that a shared machine's load hits both alike. For each run pair the
ratio new / old is recorded; the table reports the median ratio and its spread (the
25th-75th percentile and min-max of the per-pair ratios, and the ratio of median latencies in
each round), the median latencies, and the outputs' max relative difference.

Usage: python bench/f32_presets.py --old OLD_EXE --new NEW_EXE [--pairs 20] [--rounds 2]
       [--threads 2] [--work DIR] [--json FILE]
Bench helper only (onnxruntime, numpy).
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
from profile_ops import make_inputs  # noqa: E402

# Blocks per preset: enough for the per-block graph to dominate, few enough to keep a run short
# (~30-200 ms here). Both binaries build the same number of blocks.
LAYERS = {
    "gmlp-ti16": 30,
    "gmlp-s16": 12,
    "gmlp-b16": 6,
    "gmlp-base": 6,
    "amlp-base": 6,
    "gmlp-large": 3,
    "amlp-large": 3,
    "gmlp-xlarge": 2,
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build(exe, preset, layers, out):
    cmd = [exe, "build", "--preset", preset, "--layers", str(layers), "-o", out, "-q"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")


def session(model, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def timed(sess, feeds):
    t0 = time.perf_counter()
    sess.run(None, feeds)
    return 1e3 * (time.perf_counter() - t0)


def compare(old, new, pairs, threads):
    """Per-pair ratios new/old (ABBA order), median latencies and max rel output difference."""
    s_old, s_new = session(old, threads), session(new, threads)
    feeds = make_inputs(s_old, 1)
    o_old, o_new = s_old.run(None, feeds)[0], s_new.run(None, feeds)[0]
    for _ in range(2):  # warm-up
        s_old.run(None, feeds)
        s_new.run(None, feeds)
    t_old, t_new = [], []
    for k in range(pairs):
        if k % 2 == 0:
            t_old.append(timed(s_old, feeds))
            t_new.append(timed(s_new, feeds))
        else:
            t_new.append(timed(s_new, feeds))
            t_old.append(timed(s_old, feeds))
    rel = float(np.abs(o_new - o_old).max() / np.abs(o_old).max())
    return np.array(t_old), np.array(t_new), rel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="baseline gmlp-onnx binary")
    ap.add_argument("--new", required=True, help="gmlp-onnx binary under test")
    ap.add_argument("--pairs", type=int, default=20, help="timed old/new run pairs per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over all presets (fresh sessions)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--presets", default=",".join(LAYERS))
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="gmlp-f32ab-")
    presets = a.presets.split(",")
    files = {}
    for p in presets:
        old, new = os.path.join(work, f"{p}.old.onnx"), os.path.join(work, f"{p}.new.onnx")
        build(a.old, p, LAYERS[p], old)
        build(a.new, p, LAYERS[p], new)
        files[p] = (old, new)
    acc = {p: {"old": [], "new": [], "rel": 0.0, "rounds": []} for p in presets}
    for r in range(a.rounds):
        for p in presets:
            log(f"round {r + 1}: {p} (load {os.getloadavg()[0]:.2f})")
            t_old, t_new, rel = compare(*files[p], a.pairs, a.threads)
            acc[p]["old"] += t_old.tolist()
            acc[p]["new"] += t_new.tolist()
            acc[p]["rel"] = max(acc[p]["rel"], rel)
            acc[p]["rounds"].append(float(np.median(t_new) / np.median(t_old)))
    rows = []
    print("| preset | blocks | pairs | before ms (median) | after ms (median) | after / before: median "
          "| 25-75% | min-max | per round (ratio of medians) | max rel after vs before |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in presets:
        t_old, t_new = np.array(acc[p]["old"]), np.array(acc[p]["new"])
        ratio = t_new / t_old
        q1, q2, q3 = np.percentile(ratio, [25, 50, 75])
        row = {"preset": p, "layers": LAYERS[p], "pairs": len(ratio), "old_ms": float(np.median(t_old)),
               "new_ms": float(np.median(t_new)), "ratio_median": float(q2), "ratio_q1": float(q1),
               "ratio_q3": float(q3), "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max()),
               "rounds": acc[p]["rounds"], "max_rel": acc[p]["rel"]}
        rows.append(row)
        print(f"| {p} | {LAYERS[p]} | {len(ratio)} | {row['old_ms']:.1f} | {row['new_ms']:.1f} | {q2:.3f} | "
              f"{q1:.3f}-{q3:.3f} | {ratio.min():.3f}-{ratio.max():.3f} | "
              f"{', '.join(f'{x:.3f}' for x in acc[p]['rounds'])} | {acc[p]['rel']:.1e} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    for old, new in files.values():
        for g in (old, old + ".data", new, new + ".data"):
            if os.path.exists(g):
                os.unlink(g)


if __name__ == "__main__":
    main()
