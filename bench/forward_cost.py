"""What a whole forward costs through `gmlp-onnx validate --bench` against ONNX Runtime's own
`InferenceSession.run` of the same file, same inputs, same intra-op threads, side by side in
one run (the aim: the tool's figure within 1.05x of ONNX Runtime's).

For each block count (default 2 and 6) it builds amlp-base `--layers L --causal` (n = 512,
vocabulary 32000: a [1, 512, 32000] logits output, 65.5 MB), writes one [1, 512] prompt of
token ids to an .npz, loads the file once in this Python's ONNX Runtime, then alternates R
rounds: `gmlp-onnx validate FILE --runtimes ort-cpu --inputs ids.npz --bench K --threads T`
(a fresh process; its median of K timed runs, after its own warm-up run), then K timed
`InferenceSession.run(None, feeds)` here (their median). Prints a Markdown table: the median of
each side's round medians, their ratio, and the 25th-75th percentiles of the per-round ratios
(neighbours in time, so that the load of a shared machine hits both alike), and beside each
median the fastest single run of that side (less moved by other processes).

With `--baseline-exe OLD` each round also runs OLD's `validate --bench` (e.g. the binary before
a change), and the table gains its column and ratio.

Usage: python bench/forward_cost.py [--exe target/release/gmlp-onnx] [--baseline-exe OLD]
       [--layers 2 6] [--rounds 5] [--runs 5] [--threads 2] [--work DIR]
Needs onnxruntime and numpy in this Python (the same ONNX Runtime version as the library
gmlp-onnx loads, for a fair comparison; the table says which it was).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd):
    log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", default=os.path.join(ROOT, "target", "release", "gmlp-onnx"))
    ap.add_argument("--baseline-exe")
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 6])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=5, help="timed runs per round and side")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="gmlp-forward-cost-")
    os.makedirs(work, exist_ok=True)
    rows = []
    for layers in a.layers:
        model = os.path.join(work, f"amlp-base-{layers}.onnx")
        run([a.exe, "build", "--preset", "amlp-base", "--layers", str(layers), "--causal", "-q",
             "-o", model])
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        (inp,) = session.get_inputs()
        ids = np.random.default_rng(0).integers(0, 32000, size=(1, 512), dtype=np.int64)
        feeds = {inp.name: ids}
        npz = os.path.join(work, f"ids-{layers}.npz")
        np.savez(npz, **feeds)
        report = os.path.join(work, f"report-{layers}.json")
        shape = session.run(None, feeds)[0].shape  # warm-up
        ours, theirs, old = [], [], []
        mins = {"ours": [], "theirs": [], "old": []}

        def validate(exe, side):
            run([exe, "validate", model, "--runtimes", "ort-cpu", "--inputs", npz, "--bench",
                 str(a.runs), "--threads", str(a.threads), "--report", report])
            with open(report) as f:
                bench = json.load(f)["runtimes"][0]["bench"]
            mins[side].append(bench["min_ms"])
            return bench["median_ms"]

        for r in range(a.rounds):
            ours.append(validate(a.exe, "ours"))
            if a.baseline_exe:
                old.append(validate(a.baseline_exe, "old"))
            times = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                session.run(None, feeds)
                times.append(1e3 * (time.perf_counter() - t0))
            theirs.append(float(np.median(times)))
            mins["theirs"].append(min(times))
            log(f"blocks {layers} round {r + 1}: validate --bench {ours[-1]:.1f} ms"
                + (f" (baseline {old[-1]:.1f} ms)" if old else "")
                + f", InferenceSession.run {theirs[-1]:.1f} ms")
        del session
        ratios = np.array(ours) / np.array(theirs)
        row = {"layers": layers, "shape": list(shape), "ours": float(np.median(ours)),
               "theirs": float(np.median(theirs)),
               "q1": float(np.percentile(ratios, 25)), "q3": float(np.percentile(ratios, 75)),
               "min_ours": min(mins["ours"]), "min_theirs": min(mins["theirs"])}
        if old:
            row["old"] = float(np.median(old))
            row["min_old"] = min(mins["old"])
            old_ratios = np.array(old) / np.array(theirs)
            row["old_q1"] = float(np.percentile(old_ratios, 25))
            row["old_q3"] = float(np.percentile(old_ratios, 75))
        rows.append(row)
    version = run([a.exe, "--version"]).strip()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d')}, {cpu_model()}, {os.cpu_count()} logical CPUs; {version} "
          f"(tree {commit or 'unknown'}); "
          f"ONNX Runtime {ort.__version__} (Python); intra-op threads {a.threads}; "
          f"{a.rounds} rounds of {a.runs} timed runs per side, interleaved.")
    print()
    base = bool(a.baseline_exe)
    head = ("| amlp-base --causal | logits | `InferenceSession.run` ms (min) | "
            "`validate --bench` ms (min) | ratio of medians (of mins) | per-round ratio 25-75% |")
    if base:
        head += (" baseline `validate --bench` ms (min) | baseline ratio of medians (of mins) | "
                 "baseline per-round 25-75% |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        line = (f"| --layers {r['layers']} | {r['shape']} | {r['theirs']:.1f} ({r['min_theirs']:.1f}) | "
                f"{r['ours']:.1f} ({r['min_ours']:.1f}) | {r['ours'] / r['theirs']:.3f} "
                f"({r['min_ours'] / r['min_theirs']:.3f}) | {r['q1']:.3f}-{r['q3']:.3f} |")
        if base:
            line += (f" {r['old']:.1f} ({r['min_old']:.1f}) | {r['old'] / r['theirs']:.3f} "
                     f"({r['min_old'] / r['min_theirs']:.3f}) | "
                     f"{r['old_q1']:.3f}-{r['old_q3']:.3f} |")
        print(line)


if __name__ == "__main__":
    main()
