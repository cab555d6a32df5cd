"""Triton generation benchmark: prints one Markdown section for BENCHMARKS.md.

A static-state causal aMLP (`build --with-past`, docs/static-state.md) is put twice into one
model repository by `gmlp-onnx triton`, once per sequence-batcher queue delay (0.1 ms, the
default, and 5 ms; otherwise the defaults: max_batch_size 8, one CPU instance, the position
kept by the server). A real tritonserver (nvidia-pytriton 0.7.0, ONNX Runtime backend from
scripts/triton_backend.sh) serves both on loopback; 1, 8 and 64 concurrent sequences, one
client thread each (tritonclient.http), send a 16-token prompt and then one-token requests
of greedy decoding (`input_ids` only), a new sequence after each 48 tokens, for a fixed
time per cell, in rounds over all cells with both delays of a concurrency back to back. Reported per cell: generated tokens/s (one per answer), p50 and
p99 latency of the one-token requests seen by the clients, the mean batch Triton
executed (inferences/executions), and from Triton's statistics the time a request queued
and the time an execution computed. Each client's first sequence is checked against one ONNX
Runtime run of the built file on the same tokens.

Usage (the Triton venv has tritonclient):
  PY=$(scripts/triton_backend.sh | sed -n 's/^GMLP_ONNX_TRITON_PYTHON=//p')
  $PY bench/triton_generation.py [--seconds 5] [--rounds 2] [--exe target/release/gmlp-onnx] > section.md
"""
import argparse
import datetime
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import triton_client as tc  # noqa: E402  (same helpers as the tests)

_spec = importlib.util.spec_from_file_location("bench_triton", os.path.join(ROOT, "bench", "triton.py"))
bench_triton = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_triton)

MODEL = ["--preset", "amlp-base", "--layers", "4", "--d-model", "256", "--d-ffn", "1024",
         "--attn-dim", "64", "--seq-len", "128", "--vocab-size", "1000", "--causal", "--with-past"]
VOCAB = 1000
PROMPT = 16
TOKENS = 48  # per sequence: the prompt's answer and 47 one-token requests
CONCURRENCY = [1, 8, 64]
DELAYS_US = [100, 5000]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def cell(url, name, clients, seconds, sess, pasts, seed):
    """`clients` threads decoding sequences back to back for `seconds`: the answers in
    time, the one-token request latencies, Triton's statistics over the cell and the worst
    difference of a first sequence from its ONNX Runtime run."""
    step_latencies = [[] for _ in range(clients)]
    answers = [0] * clients
    worst = [0.0] * clients
    errors = []
    barrier = threading.Barrier(clients + 1)
    stop = [0.0]

    def worker(k):
        try:
            rng = np.random.default_rng(seed + k)
            client = tc.http_client(url)
            barrier.wait()
            sid = seed * 1000 + k * 10_000_000
            first = True
            while time.perf_counter() < stop[0]:
                sid += 1
                ids = rng.integers(0, VOCAB, size=(1, PROMPT)).astype(np.int64)
                sent, got = [], []
                for t in range(TOKENS):
                    last = t == TOKENS - 1 or time.perf_counter() >= stop[0]
                    t0 = time.perf_counter()
                    logits = tc.infer(client, name, {"input_ids": ids}, ["logits"], sequence_id=sid,
                                      sequence_start=(t == 0), sequence_end=last)["logits"]
                    done = time.perf_counter()
                    if done <= stop[0]:
                        answers[k] += 1
                        if t > 0:
                            step_latencies[k].append(done - t0)
                    sent.extend(int(x) for x in ids[0])
                    got.append(logits[0])
                    if last:
                        break
                    ids = np.array([[int(np.argmax(logits[0, -1]))]], dtype=np.int64)
                if first:
                    ref = tc.static_reference(sess, pasts, np.array([sent], dtype=np.int64))[0]
                    row = 0
                    for g in got:
                        worst[k] = max(worst[k], tc.rel(g, ref[row:row + g.shape[0]]))
                        row += g.shape[0]
                    first = False
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
            try:
                barrier.abort()
            except Exception:
                pass

    before = tc.statistics(url, name)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    stop[0] = time.perf_counter() + seconds
    start = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{name}, {clients} sequences: {errors[0]}")
    wall = min(time.perf_counter(), stop[0]) - start
    after = tc.statistics(url, name)
    return {
        "answers": sum(answers),
        "seconds": wall,
        "latencies": [x for per in step_latencies for x in per],
        "stats": {k: after[k] - before[k] for k in ("inference_count", "execution_count", "queue_ns", "compute_ns")},
        "max_rel": max(worst),
    }


def summary(parts):
    """One row from the cells of every round of a setting."""
    flat = np.array([x for p in parts for x in p["latencies"]])
    stats = {k: sum(p["stats"][k] for p in parts) for k in parts[0]["stats"]}
    executions = max(stats["execution_count"], 1)
    return {
        "tokens_per_s": sum(p["answers"] for p in parts) / sum(p["seconds"] for p in parts),
        "p50": float(np.percentile(flat, 50)) * 1e3,
        "p99": float(np.percentile(flat, 99)) * 1e3,
        "mean_batch": stats["inference_count"] / executions,
        "queue_ms": stats["queue_ns"] / max(stats["inference_count"], 1) / 1e6,
        "compute_ms": stats["compute_ns"] / executions / 1e6,
        "max_rel": max(p["max_rel"] for p in parts),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5.0, help="per cell and round")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds over all cells; the two delays alternate which goes first")
    p.add_argument("--exe", default=os.path.join(ROOT, "target", "release", "gmlp-onnx"))
    p.add_argument("--work", default=None)
    args = p.parse_args()
    env = bench_triton.triton_env()
    work = args.work or tempfile.mkdtemp(prefix="gmlp-triton-generation-")
    repo = os.path.join(work, "repo")
    model = os.path.join(work, "lm.onnx")
    log("building the model")
    subprocess.run([args.exe, "build", *MODEL, "-q", "-o", model], check=True, capture_output=True)
    names = {}
    for delay in DELAYS_US:
        names[delay] = f"lm-delay-{delay}us"
        subprocess.run([args.exe, "triton", model, "--repo", repo, "--triton-name", names[delay],
                        "--triton-max-queue-delay-us", str(delay)], check=True, capture_output=True)
    inputs, _ = tc.onnx_io(model)
    pasts = [(n, t, d) for n, t, d in inputs if n.startswith("past_")]
    sess = tc.session(model)
    proc, url = bench_triton.start_server(env, repo, os.path.join(work, "server.log"))
    parts = {(c, d): [] for c in CONCURRENCY for d in DELAYS_US}
    try:
        for delay in DELAYS_US:  # warm-up: each model's first runs
            cell(url, names[delay], 2, 1.0, sess, pasts, seed=1)
        seed = 10
        for r in range(args.rounds):
            for clients in CONCURRENCY:
                for delay in (DELAYS_US if r % 2 == 0 else DELAYS_US[::-1]):
                    log(f"round {r + 1}: {clients} sequences, queue delay {delay} us, {args.seconds} s")
                    seed += 1
                    parts[(clients, delay)].append(
                        cell(url, names[delay], clients, args.seconds, sess, pasts, seed))
    finally:
        proc.kill()
        proc.wait()
    rows = [(c, d, summary(parts[(c, d)])) for c in CONCURRENCY for d in DELAYS_US]
    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except Exception:
        pass
    print("## Triton generation: a static-state model, tokens-only requests, 1 to 64 sequences")
    print()
    print(f"Date: {datetime.date.today()}. Machine: {cpu}, {os.cpu_count()} cores, Linux {platform.release()}. "
          "tritonserver 2.51.0 (nvidia-pytriton 0.7.0) with the ONNX Runtime backend r24.10 built from "
          "../shared/vendor against onnxruntime 1.31.1; clients: tritonclient.http 2.73.0, one thread per "
          "sequence, in one Python process on the same cores as the server. Produced by "
          f"`bench/triton_generation.py` in one run: {args.rounds} rounds over every row, {args.seconds:g} s "
          "per row and round, the two delays of a row back to back (alternating which runs first).")
    print()
    print("Model: amlp-base with 4 blocks, d_model 256, d_ffn 1024, attention 64, n = 128, vocabulary 1000, "
          "`--causal --with-past` (static state). Repository: `gmlp-onnx triton` defaults (`max_batch_size: 8`, "
          "`oldest` sequence batcher, one CPU instance, the position kept by the server) and "
          "`--triton-max-queue-delay-us` 100 or 5000. Each sequence: a 16-token prompt, then 47 one-token "
          "requests of greedy decoding, then the next sequence.")
    print()
    print("| sequences | queue delay | tokens/s | p50 ms | p99 ms | mean batch executed | queued ms / request "
          "| compute ms / execution | rel vs ORT |")
    print("|---|---|---|---|---|---|---|---|---|")
    for clients, delay, r in rows:
        print(f"| {clients} | {delay / 1000:g} ms | {r['tokens_per_s']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | "
              f"{r['mean_batch']:.2f} | {r['queue_ms']:.2f} | {r['compute_ms']:.2f} | {r['max_rel']:.1e} |")
    print()
    print("tokens/s: answers per second (each answer gives its sequence the next token); p50/p99: the one-token "
          "requests only, as the clients see them; queued and compute: Triton's statistics (time a request waited "
          "in the sequence batcher; time ONNX Runtime ran an execution); rel vs ORT: each client's first sequence "
          "against one ONNX Runtime run of the built file on the same tokens. Load average at the end: "
          f"{os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
