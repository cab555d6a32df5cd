"""A/B of one decoding step between two gmlp-onnx binaries (e.g. before and after a change
to the decoder), side by side in one run: both binaries decode the same with-past model
(built once, by binary A) with `generate --json`, alternating A, B, A, B ... so that load
changes on a shared machine hit both alike. Prints a Markdown table of the per-round
median step times and the ratio B / A.

With `--own-builds` (a change to the graph instead of the decoder) each binary builds its
own model and binary B decodes both, alternating; `--forward` then also times, alternating,
a whole forward (`validate --bench 3`, sequence = n) of each binary's variable-length build;
how many greedy tokens the two models share is reported (otherwise they must all agree).

Usage: python3 bench/step_ab.py --a OLD_BIN --b NEW_BIN [--rounds 5] [--runtime ort-cpu]
       [--dtype f32] [--with-past growing|static] [--own-builds] [--forward]
       [--prompt 448] [--new-tokens 32] [--threads N] [--target ort-gpu]
The product is Rust; this script only drives the CLI (Python stdlib only).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CONFIG = ["--preset", "amlp-base", "--layers", "6", "--causal"]


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
    ap.add_argument("--target", default=None, help="build both models for this --target")
    ap.add_argument("--with-past", default="growing", choices=["growing", "static"])
    ap.add_argument("--own-builds", action="store_true",
                    help="each binary builds its own model; binary B decodes both")
    ap.add_argument("--forward", action="store_true",
                    help="with --own-builds: also time each binary's whole forward")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="gmlp-step-ab-")
    os.makedirs(work, exist_ok=True)
    extra = ["--threads", str(a.threads)] if a.threads else []
    flags = [*CONFIG, "--dtype", a.dtype, *(["--target", a.target] if a.target else [])]
    builders = {"A": a.a, "B": a.b if a.own_builds else a.a}
    models, forwards = {}, {}
    for label, exe in builders.items():
        tag = label if a.own_builds else "A"
        models[label] = os.path.join(work, f"amlp6-{a.with_past}-{a.dtype}-{a.target or 'ort'}-{tag}.onnx")
        if not os.path.exists(models[label]):
            run([exe, "build", *flags, "--with-past", a.with_past, "-q", "-o", models[label]])
        if a.forward:
            forwards[label] = os.path.join(work, f"amlp6-variable-{a.dtype}-{tag}.onnx")
            if not os.path.exists(forwards[label]):
                run([exe, "build", *flags, "-q", "-o", forwards[label]])
    deciders = {"A": a.b if a.own_builds else a.a, "B": a.b}
    prompt = ",".join(str((7919 * i + 13) % 32000) for i in range(a.prompt))
    medians = {"A": [], "B": []}
    forward_ms = {"A": [], "B": []}
    tokens = {}
    for _ in range(a.rounds):
        for label in ("A", "B"):
            out = json.loads(run([deciders[label], "generate", models[label], "--runtime",
                                  a.runtime, "--prompt-ids", prompt, "--max-new-tokens",
                                  str(a.new_tokens), "--json", "-q", *extra]))[0]
            medians[label].append(out["step_median_ms"])
            tokens.setdefault(label, out["tokens"])
        for label in forwards:
            report = os.path.join(work, "forward.json")
            run([a.b, "validate", forwards[label], "--runtimes", a.runtime, "--batch", "1",
                 "--bench", "3", "--report", report, *extra])
            with open(report) as f:
                forward_ms[label].append(json.load(f)["runtimes"][0]["bench"]["median_ms"])
    same = sum(x == y for x, y in zip(tokens["A"], tokens["B"]))
    if same != len(tokens["A"]) and not a.own_builds:
        raise SystemExit("A and B generated different tokens")
    fmt = lambda v: ", ".join(f"{x:.2f}" for x in v)
    print(f"| runtime | dtype | state | prompt | rounds | what | A median ms (per round) | "
          f"B median ms (per round) | B / A |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = [("step", medians)] + ([("whole forward", forward_ms)] if forwards else [])
    for what, values in rows:
        ma, mb = statistics.median(values["A"]), statistics.median(values["B"])
        print(f"| {a.runtime} | {a.dtype} | {a.with_past} | {a.prompt} | {a.rounds} | {what} | "
              f"{ma:.2f} ({fmt(values['A'])}) | {mb:.2f} ({fmt(values['B'])}) | {mb / ma:.3f} |")
    if a.own_builds:
        # Two builds may round differently: greedy tokens on seeded (nearly flat) logits can
        # then part ways, which is reported, not an error.
        print(f"\nGreedy tokens of B's model equal to A's: {same}/{len(tokens['A'])}.")


if __name__ == "__main__":
    main()
