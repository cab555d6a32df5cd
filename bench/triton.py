"""Triton Inference Server benchmark: prints one Markdown section for BENCHMARKS.md.

For each model (gmlp-ti16 as the preset defines it, and a small aMLP token model) the
release binary writes a model repository (`gmlp-onnx triton`, default settings: one CPU
instance, max_batch_size 8, dynamic batching with max_queue_delay 100 µs), a real
tritonserver (nvidia-pytriton 0.7.0, ONNX Runtime backend from scripts/triton_backend.sh)
serves it on loopback, and 1, 4 and 16 concurrent HTTP clients (tritonclient, one per
thread) send one-example requests for a fixed time. Reported: requests/s, p50 and p99
latency seen by the clients, and the mean batch Triton executed (inferences/executions).
Every response's first request per client is checked against ONNX Runtime in-process.

Usage (the Triton venv has tritonclient):
  PY=$(scripts/triton_backend.sh | sed -n 's/^GMLP_ONNX_TRITON_PYTHON=//p')
  $PY bench/triton.py [--seconds 8] > triton-section.md
"""
import argparse
import datetime
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXE = os.path.join(ROOT, "target", "release", "gmlp-onnx")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import triton_client as tc  # noqa: E402  (same helpers as the tests)

MODELS = [
    ("gmlp-ti16", ["--preset", "gmlp-ti16"], 1),
    ("amlp-small", ["--preset", "amlp-base", "--layers", "4", "--d-model", "256", "--d-ffn", "1024",
                    "--attn-dim", "64", "--seq-len", "128", "--vocab-size", "1000"], 1000),
]
CONCURRENCY = [1, 4, 16]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def triton_env():
    out = subprocess.run([os.path.join(ROOT, "scripts", "triton_backend.sh")], check=True,
                         capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_server(env, repo, log_path):
    http, grpc, metrics = free_ports(3)
    cmd = [env["GMLP_ONNX_TRITONSERVER"], f"--model-repository={repo}",
           f"--backend-directory={env['GMLP_ONNX_TRITON_BACKENDS']}",
           "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
           f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
           "--exit-timeout-secs=5"]
    proc = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            env=dict(os.environ, LD_LIBRARY_PATH=env["GMLP_ONNX_TRITON_LIBS"]))
    url = f"127.0.0.1:{http}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"tritonserver exited: see {log_path}")
        try:
            if tc.http_client(url).is_server_ready():
                return proc, url
        except Exception:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("tritonserver not ready after 120 s")


def load(url, name, model, int_high, clients, seconds, rng):
    inputs, outputs = tc.onnx_io(model)
    output_names = [o[0] for o in outputs]
    sess = tc.session(model)
    pool = [tc.make_inputs(rng, inputs, int_high) for _ in range(8)]
    expected = [dict(zip(output_names, sess.run(output_names, f))) for f in pool]
    latencies = [[] for _ in range(clients)]
    worst = [0.0] * clients
    errors = []
    barrier = threading.Barrier(clients + 1)
    stop = [0.0]

    def worker(k):
        try:
            client = tc.http_client(url)
            j = k % len(pool)
            got = tc.infer(client, name, pool[j], output_names)  # warm-up and check
            worst[k] = max(tc.rel(got[o], expected[j][o]) for o in output_names)
            barrier.wait()
            i = k
            while time.perf_counter() < stop[0]:
                t0 = time.perf_counter()
                tc.infer(client, name, pool[i % len(pool)], output_names)
                latencies[k].append(time.perf_counter() - t0)
                i += 1
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
    wall = time.perf_counter() - start
    if errors:
        raise SystemExit(f"{name}: {errors[0]}")
    flat = np.array([x for per in latencies for x in per])
    # The warm-up requests count too (they are a small part of the total).
    after = tc.statistics_after(url, name, before, len(flat) + clients)
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    return {
        "requests": len(flat),
        "rps": len(flat) / wall,
        "p50": float(np.percentile(flat, 50)) * 1e3,
        "p99": float(np.percentile(flat, 99)) * 1e3,
        "mean_batch": inferences / max(executions, 1),
        "max_rel": max(worst),
    }


def in_process(model, int_high, seconds, rng):
    """ONNX Runtime in this process with its default threads, one example per run: the
    side-by-side baseline for the table (same machine, same moment)."""
    import onnxruntime as ort

    inputs, outputs = tc.onnx_io(model)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = tc.make_inputs(rng, inputs, int_high)
    sess.run(None, feeds)
    times = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return len(times) / sum(times), float(np.percentile(times, 50)) * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=8.0, help="per concurrency level")
    p.add_argument("--work", default=None)
    args = p.parse_args()
    env = triton_env()
    work = args.work or tempfile.mkdtemp(prefix="gmlp-triton-bench-")
    repo = os.path.join(work, "repo")
    rows = []
    baselines = {}
    configs = {}
    for name, build_args, _ in MODELS:
        path = os.path.join(work, f"{name}.onnx")
        log(f"building {name}")
        subprocess.run([EXE, "build", *build_args, "-q", "-o", path], check=True, capture_output=True)
        subprocess.run([EXE, "triton", path, "--repo", repo, "--triton-name", name], check=True,
                       capture_output=True)
        configs[name] = open(os.path.join(repo, name, "config.pbtxt")).read()
    proc, url = start_server(env, repo, os.path.join(work, "server.log"))
    try:
        rng = np.random.default_rng(0)
        for name, _, int_high in MODELS:
            baselines[name] = in_process(os.path.join(work, f"{name}.onnx"), int_high, args.seconds / 2, rng)
            for clients in CONCURRENCY:
                log(f"{name}: {clients} clients for {args.seconds} s")
                r = load(url, name, os.path.join(work, f"{name}.onnx"), int_high, clients, args.seconds, rng)
                rows.append((name, clients, r))
    finally:
        proc.kill()
        proc.wait()
    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except Exception:
        pass
    print("## Triton Inference Server (HTTP, one CPU instance, dynamic batching)")
    print()
    print(f"Date: {datetime.date.today()}. Machine: {cpu}, {os.cpu_count()} cores, Linux {platform.release()}. "
          "tritonserver 2.51.0 (nvidia-pytriton 0.7.0) with the ONNX Runtime backend r24.10 built from "
          "../shared/vendor against onnxruntime 1.31.1; clients: tritonclient.http, one per thread, on the "
          "same cores as the server. Produced by `bench/triton.py` in one run, "
          f"{args.seconds:g} s per row, one example per request.")
    print()
    print("Repository settings (`gmlp-onnx triton` defaults): `max_batch_size: 8`, "
          "`dynamic_batching { max_queue_delay_microseconds: 100 }`, `instance_group [ { count: 1 kind: KIND_CPU } ]`.")
    print()
    print("ONNX Runtime in the benchmark process (default threads, one example per run, same run, "
          "server idle): " + "; ".join(f"{n} {rps:.1f} runs/s, p50 {p50:.1f} ms" for n, (rps, p50) in baselines.items())
          + f". Load average at the end: {os.getloadavg()[0]:.1f} (the machine is shared).")
    print()
    print("| model | clients | requests/s | p50 ms | p99 ms | mean batch executed | rel vs ORT |")
    print("|---|---|---|---|---|---|---|")
    for name, clients, r in rows:
        print(f"| {name} | {clients} | {r['rps']:.1f} | {r['p50']:.1f} | {r['p99']:.1f} | "
              f"{r['mean_batch']:.2f} | {r['max_rel']:.1e} |")
    print()
    print("Models: gmlp-ti16 as the preset defines it (224x224 images, 30 blocks, 5.9 M parameters); "
          "amlp-small = amlp-base with 4 blocks, d_model 256, d_ffn 1024, attention 64, n = 128, "
          "vocabulary 1000. \"mean batch executed\" is Triton's inference count over its execution count.")


if __name__ == "__main__":
    main()
