"""ONNX Runtime CPU kernel time per (operator type, block part), parts read from node names.

Like bench/profile_ops.py, but also splits kernel time by the part of a gMLP block a node
belongs to (`spatial`, with the int8 spatial MatMul's input and output transposes apart as
`sp_t_in` / `sp_t_out`; `proj_in`; `proj_out`; `norm`; `other`). Node names survive ONNX
Runtime's fusions and `quantize_dynamic`, so our int8 file and `quantize_dynamic`'s file of our
f32 file compare part by part.

Usage: python bench/profile_parts.py MODEL.onnx [MODEL2.onnx ...] [--runs 10] [--threads 2]
Pass models more than once (A B A B) to see the spread between passes on a shared machine.
Bench helper only (onnxruntime, numpy).
"""
import argparse
import collections
import json
import os
import sys
import tempfile

import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_ops import make_inputs  # noqa: E402


def part_of(node):
    if "spatial" in node:
        if "transpose_in" in node:
            return "sp_t_in"
        if "transpose_out" in node:
            return "sp_t_out"
        return "spatial"
    for part in ("proj_in", "proj_out", "norm"):
        if part in node:
            return part
    return "other"


def profile(model, runs, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    tmp = tempfile.mkdtemp(prefix="gmlp-parts-")
    so.profile_file_prefix = os.path.join(tmp, "prof")
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    feeds = make_inputs(sess, 1)
    for _ in range(2):  # warm-up, excluded below
        sess.run(None, feeds)
    for _ in range(runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.unlink(path)
    os.rmdir(tmp)
    model_runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    start = model_runs[-runs]["ts"]
    time_us, nodes = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or e["ts"] < start:
            continue
        key = (e["args"].get("op_name", "?"), part_of(e["name"][: -len("_kernel_time")]))
        time_us[key] += e["dur"]
        nodes[key] += 1
    total = sum(time_us.values())
    run_us = sorted(e["dur"] for e in model_runs[-runs:])
    print(f"{os.path.basename(model)}: kernel {total / runs / 1e3:.1f} ms per run, "
          f"model_run median {run_us[runs // 2] / 1e3:.1f} ms")
    for (op, part), us in time_us.most_common():
        print(f"  {op:28s} {part:9s} {us / runs / 1e3:7.2f} ms {100 * us / total:5.1f}%  "
              f"nodes {nodes[(op, part)] // runs}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    for m in a.models:
        profile(m, a.runs, a.threads)


if __name__ == "__main__":
    main()
