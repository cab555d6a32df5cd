"""Several Triton servers behind the router: prints one Markdown section for BENCHMARKS.md.

A static-state causal aMLP (`build --with-past`) is written into one model repository by
`gmlp-onnx triton --servers ... --router-config`, which also writes the haproxy
configuration; three tritonservers (scripts/triton_backend.sh) serve the repository and
haproxy (Debian 12's 2.6) routes to them, all on 127.0.0.1. Every measurement is a run of
`gmlp-onnx generate --server URL --prompts-file P --json` (the CLI's client: one thread per
sequence, tokens only), read from its JSON:

  1. one server alone (its own URL) vs the three behind the router: tokens/s of the whole
     run and the p50/p99 of its requests, SEQUENCES sequences of PROMPT + NEW tokens;
  2. the router's own cost: one sequence, straight to a server vs through the router
     (which sends it to one server), p50/p99 of its requests;
  3. a lost server: the routed run again, SIGKILL to one server once it has answered a
     third of its share (Triton's statistics), the time from the kill to the last
     restarted sequence's last token (the JSON's `started_unix_ms` + `done_ms`), and the
     restarts.

Python standard library only. Usage:
  python3 bench/triton_fleet.py [--exe target/debug/gmlp-onnx] [--rounds 2] > section.md
"""
import argparse
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ["--preset", "amlp-base", "--layers", "4", "--d-model", "256", "--d-ffn", "1024",
         "--attn-dim", "64", "--seq-len", "128", "--vocab-size", "1000", "--causal", "--with-past"]
SEQUENCES = 48
PROMPT = 16
NEW = 48


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def triton_env():
    out = subprocess.run([os.path.join(ROOT, "scripts", "triton_backend.sh")], check=True,
                         capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except Exception:
        return None, b""


def wait(what, ok, seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.1)
    raise SystemExit(f"{what} not ready after {seconds} s")


def start_server(env, repo, http, log_path):
    grpc, metrics = free_port(), free_port()
    cmd = [env["GMLP_ONNX_TRITONSERVER"], f"--model-repository={repo}",
           f"--backend-directory={env['GMLP_ONNX_TRITON_BACKENDS']}",
           "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
           f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
           "--exit-timeout-secs=5"]
    return subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            env=dict(os.environ, LD_LIBRARY_PATH=env["GMLP_ONNX_TRITON_LIBS"]))


def routed_to(router_port, server_port, probe_id):
    """Whether the router sends a one-request sequence (id `probe_id`) to `server_port`."""
    body = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}],
                       "parameters": {"sequence_id": probe_id, "sequence_start": True, "sequence_end": True}})
    req = urllib.request.Request(f"http://127.0.0.1:{router_port}/v2/models/lm/infer", data=body.encode(),
                                 headers={"Content-Type": "application/json", "X-Sequence-Id": str(probe_id)})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.headers.get("X-Triton-Server") == f"127.0.0.1:{server_port}"
    except Exception:
        return False


def inferences(port):
    status, body = get(port, "/v2/models/lm/stats")
    return json.loads(body)["model_stats"][0]["inference_count"] if status == 200 else 0


def generate(exe, url, prompts, background=False, new=NEW):
    cmd = [exe, "generate", "--server", url, "--triton-name", "lm", "--prompts-file", prompts,
           "--max-new-tokens", str(new), "--json", "-q"]
    if background:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]


def row(label, r):
    return (f"| {label} | {len(r['restarts'])} | {r['tokens_per_s']:.0f} | {r['request_p50_ms']:.1f} | "
            f"{r['request_p99_ms']:.1f} | {r['wall_ms'] / 1e3:.2f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", default=os.path.join(ROOT, "target", "debug", "gmlp-onnx"))
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    env = triton_env()
    work = tempfile.mkdtemp(prefix="fleet-bench-")
    model, repo, cfg = (os.path.join(work, n) for n in ("lm.onnx", "repo", "router.cfg"))
    subprocess.run([args.exe, "build", *MODEL, "-o", model, "-q"], check=True)
    ports = [free_port() for _ in range(3)]
    router_port = free_port()
    subprocess.run([args.exe, "triton", model, "--repo", repo, "--triton-name", "lm",
                    "--servers", ",".join(f"127.0.0.1:{p}" for p in ports),
                    "--router-config", cfg, "--router-port", str(router_port)],
                   check=True, capture_output=True)
    servers = [start_server(env, repo, port, os.path.join(work, f"s{k}.log")) for k, port in enumerate(ports)]
    router = subprocess.Popen(["haproxy", "-db", "-f", cfg], stdout=open(os.path.join(work, "router.log"), "w"),
                              stderr=subprocess.STDOUT)
    try:
        for port in ports:
            wait(f"server {port}", lambda: get(port, "/v2/models/lm/ready")[0] == 200)
        wait("router", lambda: get(router_port, "/v2/health/ready")[0] == 200)
        prompts = os.path.join(work, "prompts.txt")
        with open(prompts, "w") as f:
            for b in range(SEQUENCES):
                f.write(",".join(str((31 * b + 7 * t + 1) % 1000) for t in range(PROMPT)) + "\n")
        one = os.path.join(work, "one.txt")
        with open(one, "w") as f:
            f.write(",".join(str(t + 1) for t in range(PROMPT)) + "\n")
        router_url, direct_url = f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{ports[0]}"
        generate(args.exe, router_url, prompts)  # warm-up: every server's first sessions
        generate(args.exe, direct_url, prompts)
        rows, overhead, kills = [], [], []
        for k in range(args.rounds):
            log(f"round {k + 1}")
            alone = generate(args.exe, direct_url, prompts)
            fleet = generate(args.exe, router_url, prompts)
            assert alone["tokens"] == fleet["tokens"], "tokens differ between one server and the fleet"
            rows += [row("1 server, direct", alone), row("3 servers, router", fleet)]
            for _ in range(3):  # alternating, 112 requests each
                d1 = generate(args.exe, direct_url, one, new=112)
                r1 = generate(args.exe, router_url, one, new=112)
                overhead.append((d1, r1))
            victim = ports[(k + 1) % 3]
            before = inferences(victim)
            proc = generate(args.exe, router_url, prompts, background=True)
            share = SEQUENCES * (NEW + 1) // 3
            wait("traffic on the victim", lambda: inferences(victim) >= before + share // 3, 300)
            killed_ms = time.time() * 1e3
            servers[ports.index(victim)].send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=600)
            assert proc.returncode == 0, "generate failed after the kill"
            r = json.loads(out)[0]
            assert r["tokens"] == fleet["tokens"], "tokens differ after the kill"
            restarted = [d for d, n in zip(r["done_ms"], r["restarts"]) if n > 0]
            others = [d for d, n in zip(r["done_ms"], r["restarts"]) if n == 0]
            last = r["started_unix_ms"] + max(restarted) - killed_ms if restarted else float("nan")
            other = r["started_unix_ms"] + max(others) - killed_ms if others else float("nan")
            kills.append((last, other, len(restarted), sum(r["restarts"]), r))
            # The lost server comes back on its ports for the next round.
            i = ports.index(victim)
            servers[i].wait()
            servers[i] = start_server(env, repo, victim, os.path.join(work, f"s{i}-{k}.log"))
            wait(f"server {victim} again", lambda: get(victim, "/v2/models/lm/ready")[0] == 200)
            probes = iter(range(1 << 40, 1 << 41))
            wait(f"the router back on {victim}", lambda: routed_to(router_port, victim, next(probes)), 60)
    finally:
        router.kill()
        for s in servers:
            s.kill()
    load = os.getloadavg()
    print(f"## Several Triton servers behind the router ({datetime.date.today()})\n")
    print(f"`bench/triton_fleet.py --rounds {args.rounds}` on {platform.machine()}, {os.cpu_count()} cores "
          f"(load average {load[0]:.1f} at the end), {os.path.basename(args.exe)}: a static-state aMLP "
          f"(4 blocks, d 256, n 128, vocabulary 1000), three tritonservers and haproxy 2.6 on 127.0.0.1, "
          f"`generate --server` with {SEQUENCES} sequences of a {PROMPT}-token prompt and {NEW} new tokens.\n")
    print("| run | sequences | tokens/s | request p50 ms | request p99 ms | wall s |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nThe router's own cost: one sequence (16 + 112 tokens, 112 requests), straight to a server "
          "and through the router in turn, requests p50 / p99 in ms:\n")
    print("| pair | direct p50 | router p50 | router − direct p50 | direct p99 | router p99 |")
    print("|---|---|---|---|---|---|")
    for k, (d, r) in enumerate(overhead):
        print(f"| {k + 1} | {d['request_p50_ms']:.2f} | {r['request_p50_ms']:.2f} | "
              f"{r['request_p50_ms'] - d['request_p50_ms']:+.2f} | "
              f"{d['request_p99_ms']:.2f} | {r['request_p99_ms']:.2f} |")
    diffs = sorted(r["request_p50_ms"] - d["request_p50_ms"] for d, r in overhead)
    print(f"\nMedian of the p50 differences: {diffs[len(diffs) // 2]:+.2f} ms per request.")
    print("\nSIGKILL to one server a third of the way into its share of the routed run:\n")
    print("| round | kill to the last restarted sequence's end, s | kill to the last other sequence's end, s "
          "| sequences restarted | restarts | run wall s |")
    print("|---|---|---|---|---|---|")
    for k, (last, other, seqs, restarts, r) in enumerate(kills):
        print(f"| {k + 1} | {last / 1e3:.2f} | {other / 1e3:.2f} | {seqs} | {restarts} | {r['wall_ms'] / 1e3:.2f} |")


if __name__ == "__main__":
    main()
