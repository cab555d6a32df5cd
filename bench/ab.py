"""Side-by-side ONNX Runtime CPU latency of several models, runs interleaved (A B C A B C ...)
so that the load of a shared machine hits every model alike.

Usage: python bench/ab.py MODEL.onnx [MODEL2.onnx ...] [--runs 10] [--threads 2] [--batch 1]
       [--json]
Prints, per model: load time, median and min latency of the timed runs (after one warm-up),
the ratio of each median to the first model's, and the spread of the per-run ratios (run k of
a model over run k of the first model, neighbours in time): their 25th-75th percentiles. Bench helper only (onnxruntime, numpy).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_ops import make_inputs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    sessions, loads = [], []
    for m in a.models:
        t0 = time.perf_counter()
        sessions.append(ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]))
        loads.append(time.perf_counter() - t0)
    feeds = [make_inputs(s, a.batch) for s in sessions]
    for s, f in zip(sessions, feeds):
        s.run(None, f)
    times = [[] for _ in sessions]
    for _ in range(a.runs):
        for k, (s, f) in enumerate(zip(sessions, feeds)):
            t0 = time.perf_counter()
            s.run(None, f)
            times[k].append(time.perf_counter() - t0)
    rows = []
    for m, load, t in zip(a.models, loads, times):
        paired = np.array(t) / np.array(times[0])
        rows.append({"model": m, "load_ms": 1e3 * load, "median_ms": 1e3 * float(np.median(t)),
                     "min_ms": 1e3 * min(t), "runs": len(t),
                     "paired_q1": float(np.percentile(paired, 25)),
                     "paired_q3": float(np.percentile(paired, 75))})
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        return
    print("| model | load ms | median ms | min ms | median / first | per-run ratio 25-75% |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {os.path.basename(r['model'])} | {r['load_ms']:.0f} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | "
              f"{r['median_ms'] / rows[0]['median_ms']:.3f} | {r['paired_q1']:.3f}-{r['paired_q3']:.3f} |")


if __name__ == "__main__":
    main()
