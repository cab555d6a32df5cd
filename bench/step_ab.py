"""A/B of one decoding step between two gmlp-onnx binaries (e.g. before and after a change
to the decoder), side by side in one run: both binaries decode the same with-past model
(built once, by binary A) with `generate --json`, alternating A, B, A, B ... so that load
changes on a shared machine hit both alike. Prints a Markdown table of the per-round
median step times and the ratio B / A.

Usage: python3 bench/step_ab.py --a OLD_BIN --b NEW_BIN [--rounds 5] [--runtime ort-cpu]
       [--dtype f32] [--prompt 448] [--new-tokens 32] [--threads N]
The product is Rust; this script only drives the CLI (Python stdlib only).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CONFIG = ["--preset", "amlp-base", "--layers", "6", "--causal", "--with-past"]


def run(cmd):
    print("$ " + " ".join(cmd)[:160], file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="binary A (baseline)")
    ap.add_argument("--b", required=True, help="binary B")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runtime", default="ort-cpu")
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--prompt", type=int, default=448)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="gmlp-step-ab-")
    model = os.path.join(work, f"amlp6-past-{a.dtype}.onnx")
    if not os.path.exists(model):
        run([a.a, "build", *CONFIG, "--dtype", a.dtype, "-q", "-o", model])
    prompt = ",".join(str((7919 * i + 13) % 32000) for i in range(a.prompt))
    extra = ["--threads", str(a.threads)] if a.threads else []
    medians = {"A": [], "B": []}
    tokens = {}
    for _ in range(a.rounds):
        for label, exe in (("A", a.a), ("B", a.b)):
            out = json.loads(run([exe, "generate", model, "--runtime", a.runtime, "--prompt-ids",
                                  prompt, "--max-new-tokens", str(a.new_tokens), "--json", "-q",
                                  *extra]))[0]
            medians[label].append(out["step_median_ms"])
            tokens.setdefault(label, out["tokens"])
    if tokens["A"] != tokens["B"]:
        raise SystemExit("A and B generated different tokens")
    ma, mb = statistics.median(medians["A"]), statistics.median(medians["B"])
    print(f"| runtime | dtype | prompt | rounds | A median step ms (per round) | "
          f"B median step ms (per round) | B / A |")
    print("|---|---|---|---|---|---|---|")
    fmt = lambda v: ", ".join(f"{x:.2f}" for x in v)
    print(f"| {a.runtime} | {a.dtype} | {a.prompt} | {a.rounds} | {ma:.2f} ({fmt(medians['A'])}) | "
          f"{mb:.2f} ({fmt(medians['B'])}) | {mb / ma:.3f} |")


if __name__ == "__main__":
    main()
