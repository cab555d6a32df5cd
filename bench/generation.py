"""Generation benchmark (docs/generation.md): prints one Markdown section (in BENCHMARKS.md).

amlp-base --layers 6 --causal (n = 512, vocabulary 32000), prompt of 448 tokens, then 64
new tokens (greedy), measured side by side in one run with the release binary:
  (a) the --with-past graph: the prompt once, then one token per step with the state fed back;
  (b) the variable-length graph without state, re-run on the whole prefix for every token;
in ONNX Runtime CPU and tract (`gmlp-onnx generate --json`), plus one whole-sequence
forward at n = 512 (`gmlp-onnx validate --bench`, batch 1) to compare a single step with.
Both ways must generate the same tokens (checked). The state size comes from `inspect`.

Usage: python3 bench/generation.py [--work DIR] [--new-tokens 64] [--prompt 448]
       [--exe BIN] [--threads N] [--dtype f32|int8] > section.md
The product is Rust; this script only drives the CLI (Python stdlib only).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXE = os.path.join(ROOT, "target", "release", "gmlp-onnx")
CONFIG = ["--preset", "amlp-base", "--layers", "6", "--causal"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd):
    log("$ " + " ".join(cmd)[:200])
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


THREADS = []


def generate(model, runtime, prompt, new_tokens):
    out = run([EXE, "generate", model, "--runtime", runtime, "--prompt-ids",
               ",".join(map(str, prompt)), "--max-new-tokens", str(new_tokens), "--json", "-q",
               *THREADS])
    return json.loads(out)[0]


def whole_forward(model, runtimes, runs):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        report = f.name
    try:
        run([EXE, "validate", model, "--runtimes", runtimes, "--batch", "1",
             "--bench", str(runs), "--report", report, *THREADS])
        with open(report) as f:
            data = json.load(f)
    finally:
        os.unlink(report)
    return {r["name"]: r["bench"]["median_ms"] for r in data["runtimes"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=None)
    ap.add_argument("--prompt", type=int, default=448)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runtimes", default="ort-cpu,tract")
    ap.add_argument("--forward-runs", type=int, default=5)
    ap.add_argument("--exe", default=None, help="gmlp-onnx binary (default: target/release)")
    ap.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads")
    ap.add_argument("--dtype", default="f32", choices=["f32", "int8"],
                    help="weights of both models (int8: dynamic quantization, docs/speed.md)")
    a = ap.parse_args()
    global EXE
    if a.exe:
        EXE = a.exe
    if a.threads:
        THREADS.extend(["--threads", str(a.threads)])
    work = a.work or tempfile.mkdtemp(prefix="gmlp-gen-bench-")
    config = CONFIG + ["--dtype", a.dtype]
    past = os.path.join(work, f"amlp6-past-{a.dtype}.onnx")
    variable = os.path.join(work, f"amlp6-variable-{a.dtype}.onnx")
    run([EXE, "build", *config, "--with-past", "-q", "-o", past])
    run([EXE, "build", *config, "-q", "-o", variable])
    state_line = next(l for l in run([EXE, "inspect", past]).splitlines() if l.startswith("state"))
    prompt = [(7919 * i + 13) % 32000 for i in range(a.prompt)]
    runtimes = a.runtimes.split(",")
    forward = whole_forward(variable, ",".join(runtimes), a.forward_runs)
    rows = []
    for rt in runtimes:
        with_past = generate(past, rt, prompt, a.new_tokens)
        rerun = generate(variable, rt, prompt, a.new_tokens)
        same = sum(1 for x, y in zip(with_past["tokens"], rerun["tokens"]) if x == y)
        # f32: the two ways must agree token for token. int8 quantizes activations with a
        # scale taken from each run's own values, so a step and a re-run differ slightly
        # and a near tie in greedy decoding may flip: reported, not fatal.
        if with_past["tokens"] != rerun["tokens"] and a.dtype == "f32":
            raise SystemExit(f"{rt}: the two ways generated different tokens")
        rows.append((rt, with_past, rerun, same, len(with_past["tokens"])))
    print(f"## Generation: with-past state vs re-running the prefix, {a.dtype}\n")
    print(f"amlp-base `--layers 6 --causal --dtype {a.dtype}` (n = 512, vocabulary 32000), batch 1, prompt {a.prompt} "
          f"tokens then {a.new_tokens} new tokens (greedy), `gmlp-onnx generate --json`; "
          f"(a) `--with-past` graph, (b) the variable-length graph re-run on the whole prefix for "
          f"every token. \"same tokens\": how many of the generated tokens the two ways agree on "
          f"(f32: all, checked). \"Steps\" are the "
          f"{a.new_tokens - 1} runs after the prompt (the last new token needs no run). Whole "
          f"forward: the variable-length graph at sequence = 512, median of "
          f"{a.forward_runs} `validate --bench` runs.\n")
    print("| runtime | (a) prefill ms | (a) steps ms | (a) median step ms | (b) prefill ms | "
          "(b) steps ms | (b) median step ms | steps (b) / (a) | total (b) / (a) | "
          "whole forward n=512 ms | step / forward | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rt, p, r, same, count in rows:
        total_a = p["prefill_ms"] + p["steps_ms"]
        total_b = r["prefill_ms"] + r["steps_ms"]
        fwd = forward[rt]
        print(f"| {rt} | {p['prefill_ms']:.1f} | {p['steps_ms']:.1f} | {p['step_median_ms']:.2f} | "
              f"{r['prefill_ms']:.1f} | {r['steps_ms']:.1f} | {r['step_median_ms']:.1f} | "
              f"{r['steps_ms'] / p['steps_ms']:.0f}x | {total_b / total_a:.1f}x | {fwd:.1f} | "
              f"1/{fwd / p['step_median_ms']:.0f} | {same}/{count} |")
    print(f"\nState (`inspect`): {state_line.split(None, 1)[1]}\n")


if __name__ == "__main__":
    main()
