"""Generation benchmark (docs/generation.md): prints one Markdown section (BENCHMARKS.md, "Generation").

amlp-base `--layers 6 --causal` (n = 512, vocabulary 32000), a prompt of 448 tokens then
64 new tokens (greedy), `gmlp-onnx generate --json` with the release binary, all rows side
by side in one run:
  growing f32        `--with-past growing`: past_* [batch, P, ·] in, present_* one row longer
  static f32         `--with-past static` (static state, ScatterND at opset 17): state written in
                     place through ONNX Runtime's I/O binding
  static f32 copy    the same file with `--copy-state`: ONNX Runtime copies the state every
                     step (what a plain Python loop gets)
  static f32 op24    `--with-past static --opset 24`: TensorScatter instead of ScatterND
  static f32 batch B `generate --prompts-file` with B prompts of different lengths (448,
                     444, 440, ... tokens) decoded together; tokens/s of all sequences
  static int4 batch B  the same with `--dtype int4` weights (rows int4-batch-1, int4-batch-8)
  growing / static int4, int8-weight-only, int8   the same with `--dtype` weights
                     (docs/quantization.md); their tokens are compared with the f32
                     rows', not required to equal them
plus one whole-sequence forward at n = 512 (the variable-length file, `validate --bench`)
to compare a step with, and the machine's read bandwidth (examples/read_bandwidth.rs, same
thread count) measured before and after the rows.

Each row shows the bytes a step moves, estimated from the file (`inspect --json`): every
initializer once (`initializer_bytes`; in a quantized model, whose head reads a quantized copy
of the embedding table, less that f32 table, of which a step only gathers one row), plus the
state it reads and writes for each sequence at the mean position P of the steps:
  static, in place   the spatial projection reads all n rows of u, the attention all n rows
                     of k and v (the token-shift state only the rows it gathers): n rows
  static, copied     + the scatter's copy of every state (read n rows, write n rows)
  growing            Concat reads P rows and writes P + 1, the mixing reads P + 1: 3P rows
and the roofline = bytes / measured bandwidth; "step / roofline" is how far a step is
from streaming its bytes at the machine's read bandwidth.
Rows are one function each (`ROWS` below). `--forward-dtypes int8,int4,...` also times,
each round, the whole forward of the variable-length file in those weight types.

Usage: python3 bench/generation.py [--threads 2] [--work DIR] [--prompt 448]
       [--new-tokens 64] [--exe BIN] [--bandwidth-exe BIN] [--rows a,b,...]
       [--forward-dtypes int8,...] > section.md
Needs `cargo build --release --bins --examples` (or --exe / --bandwidth-exe). The product is
Rust; this script only drives the CLI (Python stdlib only).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = ["--preset", "amlp-base", "--layers", "6", "--causal"]
MB = 1e6


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd):
    log("$ " + " ".join(cmd)[:200])
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


class Bench:
    """What every row shares: the binaries, the work directory, the prompt, the builds."""

    def __init__(self, a):
        self.exe = a.exe or os.path.join(ROOT, "target", "release", "gmlp-onnx")
        self.bandwidth_exe = a.bandwidth_exe or os.path.join(
            ROOT, "target", "release", "examples", "read_bandwidth")
        self.threads = a.threads
        self.work = a.work or tempfile.mkdtemp(prefix="gmlp-gen-bench-")
        os.makedirs(self.work, exist_ok=True)
        self.prompt = [(7919 * i + 13) % 32000 for i in range(a.prompt)]
        self.new_tokens = a.new_tokens
        self.forward_runs = a.forward_runs
        self.built = {}
        self.reference_tokens = None

    def thread_args(self):
        return ["--threads", str(self.threads)] if self.threads else []

    def build(self, name, flags):
        """The model built with CONFIG + flags (once per name)."""
        if name not in self.built:
            path = os.path.join(self.work, f"{name}.onnx")
            run([self.exe, "build", *CONFIG, *flags, "-q", "-o", path])
            self.built[name] = (path, json.loads(run([self.exe, "inspect", path, "--json"])))
        return self.built[name]

    def generate(self, model, extra):
        out = run([self.exe, "generate", model, "--runtime", "ort-cpu", "--max-new-tokens",
                   str(self.new_tokens), "--json", "-q", *self.thread_args(), *extra])
        return json.loads(out)[0]

    def bandwidth(self):
        out = run([self.bandwidth_exe, str(self.threads or 2), "1024", "10"])
        return json.loads(out)

    def whole_forward_ms(self, dtype="f32"):
        name = "variable" if dtype == "f32" else f"variable-{dtype}"
        path, _ = self.build(name, ["--dtype", dtype] if dtype != "f32" else [])
        report = os.path.join(self.work, "forward.json")
        run([self.exe, "validate", path, "--runtimes", "ort-cpu", "--batch", "1", "--bench",
             str(self.forward_runs), "--report", report, *self.thread_args()])
        with open(report) as f:
            return json.load(f)["runtimes"][0]["bench"]["median_ms"]


def same_tokens(row, f32_rows):
    """How many of `row`'s tokens equal the first f32 row's ("–" without an f32 row)."""
    if not f32_rows:
        return "–"
    same = sum(x == y for x, y in zip(row["tokens"], f32_rows[0]["tokens"]))
    return f"{same}/{len(row['tokens'])}"


def state_bytes(info, form, position, copied=False):
    """Bytes of state one sequence's step reads and writes (see the module doc)."""
    decoding = info["decoding"]
    n = decoding["max_sequence"]
    total = 0
    for s in decoding["state"]:
        row = s["width"] * 4
        if form == "static":
            read = 0 if s["past"].startswith("past_shift") else n * row
            total += read + (2 * n * row if copied else 0)
        elif s.get("window") is None:
            total += 3 * position * row
        else:
            total += 2 * s["window"] * row
    return total


def weight_bytes(info):
    """Bytes of the weights a step reads (see the module doc): every initializer, less the
    f32 embedding table where the head reads a quantized copy (`quantized_copies_of`)."""
    total = info["initializer_bytes"]
    if "embed.weight" in info.get("quantized_copies_of", []):
        cfg = info["config"]
        total -= cfg["task"]["vocab_size"] * cfg["d_model"] * 4
    return total


def step_row(b, label, model, flags, form, extra=(), copied=False, f32=True):
    """One sequence: the prompt, then single steps, with the file `model` built with
    `flags`; its step time against the whole forward and against the roofline of the
    bytes it moves. `f32` rows must generate the tokens of every other f32 row (checked);
    a quantized row reports how many of them it generates."""
    path, info = b.build(model, flags)
    g = b.generate(path, ["--prompt-ids", ",".join(map(str, b.prompt)), *extra])
    position = len(b.prompt) + (b.new_tokens - 1) / 2
    weights = weight_bytes(info)
    state = state_bytes(info, form, position, copied)
    return {
        "label": label, "batch": 1, "gen": g, "weights": weights, "state": state,
        "step_ms": g["step_median_ms"], "tokens_per_s": g["step_tokens_per_s"],
        "tokens": g["tokens"], "in_place": g.get("state_in_place", False), "f32": f32,
    }


def batch_row(b, batch, dtype="f32"):
    """`batch` prompts of different lengths decoded together (static state, in place), in
    f32 or with `--dtype` weights (then their tokens are compared, not required equal)."""
    name, flags = "static-f32", ["--with-past", "static"]
    if dtype != "f32":
        name, flags = f"static-{dtype}", [*flags, "--dtype", dtype]
    path, info = b.build(name, flags)
    prompts = [b.prompt[:len(b.prompt) - 4 * k] for k in range(batch)]
    file = os.path.join(b.work, f"prompts-{batch}.txt")
    with open(file, "w") as f:
        f.write("".join(",".join(map(str, p)) + "\n" for p in prompts))
    g = b.generate(path, ["--prompts-file", file])
    position = statistics.mean(len(p) for p in prompts) + (b.new_tokens - 1) / 2
    return {
        "label": f"static {dtype} batch {batch}", "batch": batch, "gen": g,
        "weights": weight_bytes(info),
        "state": batch * state_bytes(info, "static", position),
        "step_ms": g["step_median_ms"], "tokens_per_s": g["step_tokens_per_s"],
        "tokens": g["tokens"][0], "in_place": g["state_in_place"], "f32": dtype == "f32",
    }


ROWS = {
    "growing-f32": lambda b: step_row(b, "growing f32", "growing-f32",
                                      ["--with-past", "growing"], "growing"),
    "static-f32": lambda b: step_row(b, "static f32", "static-f32", ["--with-past", "static"], "static"),
    "static-f32-copy": lambda b: step_row(b, "static f32, state copied", "static-f32",
                                          ["--with-past", "static"], "static", extra=["--copy-state"],
                                          copied=True),
    "static-f32-op24": lambda b: step_row(b, "static f32 opset 24 (TensorScatter)",
                                          "static-f32-op24",
                                          ["--with-past", "static", "--opset", "24"], "static"),
    "growing-int4": lambda b: step_row(b, "growing int4", "growing-int4",
                                       ["--with-past", "growing", "--dtype", "int4"],
                                       "growing", f32=False),
    "growing-int8-weight-only": lambda b: step_row(
        b, "growing int8 weight-only", "growing-int8wo",
        ["--with-past", "growing", "--dtype", "int8-weight-only"], "growing", f32=False),
    "growing-int8": lambda b: step_row(b, "growing int8 (dynamic)", "growing-int8",
                                       ["--with-past", "growing", "--dtype", "int8"],
                                       "growing", f32=False),
    "static-int4": lambda b: step_row(b, "static int4", "static-int4",
                                      ["--with-past", "static", "--dtype", "int4"], "static",
                                      f32=False),
    "static-int8-weight-only": lambda b: step_row(
        b, "static int8 weight-only", "static-int8wo",
        ["--with-past", "static", "--dtype", "int8-weight-only"], "static", f32=False),
    "static-int8": lambda b: step_row(b, "static int8 (dynamic)", "static-int8",
                                      ["--with-past", "static", "--dtype", "int8"], "static",
                                      f32=False),
    "batch-1": lambda b: batch_row(b, 1),
    "batch-4": lambda b: batch_row(b, 4),
    "batch-8": lambda b: batch_row(b, 8),
    "int4-batch-1": lambda b: batch_row(b, 1, "int4"),
    "int4-batch-8": lambda b: batch_row(b, 8, "int4"),
}


def median(values):
    return statistics.median(values)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=None)
    ap.add_argument("--prompt", type=int, default=448)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--forward-runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of every row (and the forward and bandwidth), interleaved")
    ap.add_argument("--exe", default=None, help="gmlp-onnx binary (default: target/release)")
    ap.add_argument("--bandwidth-exe", default=None,
                    help="read_bandwidth example (default: target/release/examples)")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--rows", default=",".join(ROWS), help="rows to run, in order")
    ap.add_argument("--forward-dtypes", default="",
                    help="also time whole forwards of the variable-length file in these "
                         "--dtype values (e.g. int8,int4), each round")
    a = ap.parse_args()
    b = Bench(a)
    names = [r for r in a.rows.split(",") if r]
    unknown = [r for r in names if r not in ROWS]
    if unknown:
        raise SystemExit(f"unknown rows {unknown} (known: {', '.join(ROWS)})")
    # Every round measures the bandwidth, the whole forward and each row once, so that a
    # machine whose speed drifts (shared hosts) hits every row alike; each ratio is taken
    # within its round, then the median over the rounds is reported.
    forward_dtypes = [d for d in a.forward_dtypes.split(",") if d]
    rounds = []
    for k in range(a.rounds):
        log(f"round {k + 1}/{a.rounds}")
        bw = b.bandwidth()["best_gb_s"] * 1e9
        forward = b.whole_forward_ms()
        others = {dt: b.whole_forward_ms(dt) for dt in forward_dtypes}
        rounds.append({"bandwidth": bw, "forward": forward, "forwards": others,
                       "rows": [ROWS[name](b) for name in names]})
    # f32 rows generate the same tokens (sequence 0 of a batch: the full prompt; checked).
    first = rounds[0]["rows"]
    f32_rows = [r for rnd in rounds for r in rnd["rows"] if r["f32"]]
    for r in f32_rows:
        if r["tokens"] != f32_rows[0]["tokens"]:
            raise SystemExit(f"{r['label']}: other tokens than {f32_rows[0]['label']}")
    forwards = [rnd["forward"] for rnd in rounds]
    bandwidths = [rnd["bandwidth"] / 1e9 for rnd in rounds]
    print("## Generation: static state written in place, batched sequences\n")
    print(f"amlp-base `--layers 6 --causal` (n = 512, vocabulary 32000), ONNX Runtime CPU, "
          f"`--threads {a.threads}`, prompt {a.prompt} tokens then {a.new_tokens} new tokens "
          f"(greedy), `gmlp-onnx generate --json`; \"step\" = median of the "
          f"{a.new_tokens - 1} single-token runs after the prompt. {a.rounds} rounds, each "
          f"measuring the read bandwidth (`examples/read_bandwidth.rs`, {a.threads} threads, "
          f"1 GiB, best of 10), one whole forward (the variable-length file at sequence = "
          f"512, batch 1, median of {a.forward_runs} `validate --bench` runs) and every row "
          f"once; ratios are taken within a round, the table shows medians over the rounds "
          f"(per-round values in brackets). Whole forward: "
          f"{', '.join(f'{f:.0f}' for f in forwards)} ms; bandwidth: "
          f"{', '.join(f'{x:.1f}' for x in bandwidths)} GB/s. Bytes per step: every weight "
          f"once plus the state each sequence reads and writes at the mean position "
          f"(bench/generation.py's doc); roofline = bytes / the round's bandwidth.\n")
    print("| row | state in place | median step ms (per round) | step / forward | tokens/s | "
          "weights MB | state MB / step | bytes / step MB | roofline ms | step / roofline | "
          "same tokens as f32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r0 in enumerate(first):
        per = [rnd["rows"][i] for rnd in rounds]
        steps = [r["step_ms"] for r in per]
        total = r0["weights"] + r0["state"]
        fraction = median([rnd["forward"] / r["step_ms"] for rnd, r in zip(rounds, per)])
        roofline = [total / rnd["bandwidth"] * 1e3 for rnd in rounds]
        over = median([r["step_ms"] / t for r, t in zip(per, roofline)])
        print(f"| {r0['label']} | {'yes' if r0['in_place'] else 'no'} | "
              f"{median(steps):.2f} ({', '.join(f'{x:.2f}' for x in steps)}) | "
              f"1/{fraction:.0f} | {median([r['tokens_per_s'] for r in per]):.0f} | "
              f"{r0['weights'] / MB:.1f} | {r0['state'] / MB:.1f} | {total / MB:.1f} | "
              f"{median(roofline):.2f} | {over:.2f}x | {same_tokens(r0, f32_rows)} |")
    labels = [r["label"] for r in first]
    for dtype in ("f32", "int4"):
        one, eight = f"static {dtype} batch 1", f"static {dtype} batch 8"
        if one in labels and eight in labels:
            i1, i8 = labels.index(one), labels.index(eight)
            ratios = [rnd["rows"][i8]["tokens_per_s"] / rnd["rows"][i1]["tokens_per_s"]
                      for rnd in rounds]
            print(f"\nBatch 8 / batch 1 tokens/s ({dtype}): **{median(ratios):.1f}x** "
                  f"({', '.join(f'{x:.1f}' for x in ratios)}).")
    for dt in forward_dtypes:
        ms = [rnd["forwards"][dt] for rnd in rounds]
        ratio = median([rnd["forward"] / rnd["forwards"][dt] for rnd in rounds])
        print(f"\nWhole forward with `--dtype {dt}`: {median(ms):.1f} ms "
              f"({', '.join(f'{x:.0f}' for x in ms)}), {ratio:.2f}x the f32 speed.")
    print("\nEvery f32 row generated the same tokens (sequence 0 of a batch: the full prompt; "
          "checked).\n")


if __name__ == "__main__":
    main()
