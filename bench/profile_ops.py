"""ONNX Runtime CPU kernel time per operator type (after ONNX Runtime's own fusions).

Runs a model with `SessionOptions.enable_profiling`, then sums the `*_kernel_time` events of
the timed runs by the operator type the profile names (fused nodes appear under their fused
type: `FusedMatMul`, `SkipLayerNormalization`, `BiasGelu`, `DynamicQuantizeMatMul`, ...).
Also counts the nodes of the optimized graph per type (what ONNX Runtime actually runs).

Usage: python bench/profile_ops.py MODEL.onnx [MODEL2.onnx ...] [--runs 5] [--threads 2]
       [--batch 1] [--json] [--optimized-dir DIR]
Prints one Markdown table per model (share of kernel time per op type, node count).
Test/bench helper only: needs onnxruntime and numpy.
"""
import argparse
import collections
import json
import os
import sys
import tempfile

import numpy as np
import onnxruntime as ort


def make_inputs(sess, batch, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        shape = [batch if not isinstance(d, int) else d for d in i.shape]
        if i.type == "tensor(int64)":
            feeds[i.name] = rng.integers(0, 256, size=shape, dtype=np.int64)
        else:
            feeds[i.name] = rng.uniform(-1, 1, size=shape).astype(np.float32)
    return feeds


def profile(model, runs, threads, batch, optimized_dir=None):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    tmp = tempfile.mkdtemp(prefix="gmlp-prof-")
    so.profile_file_prefix = os.path.join(tmp, "prof")
    if optimized_dir:
        so.optimized_model_filepath = os.path.join(optimized_dir, os.path.basename(model) + ".opt.onnx")
    # Profiling starts only after the warm-up runs: a first session warms up, a second profiles.
    warm = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    feeds = make_inputs(warm, batch)
    warm.run(None, feeds)
    del warm
    so.enable_profiling = True
    so.optimized_model_filepath = ""
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)  # warm-up, excluded below
    for _ in range(runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.unlink(path)
    os.rmdir(tmp)
    # Events come per run in order; keep the kernels of the last `runs` model runs.
    model_runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    start = model_runs[-runs]["ts"] if len(model_runs) >= runs else 0
    per_op = collections.Counter()
    nodes = collections.defaultdict(set)
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or e["ts"] < start:
            continue
        op = e["args"].get("op_name", "?")
        per_op[op] += e["dur"]
        nodes[op].add(e["name"][: -len("_kernel_time")])
    total = sum(per_op.values())
    run_us = [e["dur"] for e in model_runs[-runs:]]
    return {
        "model": model,
        "kernel_us_per_run": total / runs,
        "model_run_us_median": sorted(run_us)[len(run_us) // 2] if run_us else None,
        "ops": [
            {"op": op, "share": us / total, "us_per_run": us / runs, "nodes": len(nodes[op])}
            for op, us in per_op.most_common()
        ],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--optimized-dir", default=None, help="also save ONNX Runtime's optimized graph here")
    a = ap.parse_args()
    results = [profile(m, a.runs, a.threads, a.batch, a.optimized_dir) for m in a.models]
    if a.json:
        json.dump(results, sys.stdout, indent=1)
        return
    for r in results:
        print(f"### {os.path.basename(r['model'])}: {r['kernel_us_per_run'] / 1e3:.1f} ms kernel time per run "
              f"(model_run median {r['model_run_us_median'] / 1e3:.1f} ms)")
        print()
        print("| op type (after ORT fusions) | share of kernel time | ms per run | nodes |")
        print("|---|---|---|---|")
        for o in r["ops"]:
            print(f"| {o['op']} | {100 * o['share']:.1f}% | {o['us_per_run'] / 1e3:.2f} | {o['nodes']} |")
        print()


if __name__ == "__main__":
    main()
