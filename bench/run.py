"""Benchmark harness: prints one Markdown report (BENCHMARKS.md is its output).

Everything is measured in one run, side by side, with the release binary:
  1. machine f32 matmul peak (one 2048^3 MatMul, ONNX Runtime and tract);
  2. build time and peak RSS per preset, against a plain copy of the same bytes;
  3. ONNX Runtime CPU and tract latency per preset, n = 128 and 512 (token presets;
     vision presets have n = 196), batch 1 and 8, with achieved GFLOP/s;
  4. toeplitz-gather vs toeplitz-expand on amlp-base: file size, load time, latency;
  5. our ONNX vs torch.onnx.export (opset 17) of the same g-mlp-pytorch aMLP with the same
     weights (needs a Python with torch, g-mlp-pytorch and safetensors: --peer-python).
Latencies come from `gmlp-onnx validate --bench`, which also checks that the runtimes agree.

Usage: python3 bench/run.py [--work DIR] [--peer-python PATH] [--quick] > BENCHMARKS.md
The product is Rust; this script only drives the CLI (Python stdlib only).
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXE = os.path.join(ROOT, "target", "release", "gmlp-onnx")
MATMUL = os.path.join(ROOT, "target", "release", "examples", "matmul_model")
TOKEN_PRESETS = ["gmlp-base", "amlp-base"]
VISION_PRESETS = ["gmlp-ti16", "gmlp-s16", "gmlp-b16"]
ALL_PRESETS = ["gmlp-ti16", "gmlp-s16", "gmlp-b16", "gmlp-base", "amlp-base", "gmlp-large", "amlp-large", "gmlp-xlarge"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def timed(cmd):
    """Wall seconds and peak RSS (KiB) of a command, via GNU time."""
    out = run(["/usr/bin/time", "-f", "%e %M", *cmd])
    secs, rss = out.stderr.strip().splitlines()[-1].split()
    return float(secs), int(rss)


def validate(model, runtimes, batch, bench, extra=()):
    """Runs `validate --bench`; `batch` None when the inputs come from a file."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        report = f.name
    try:
        sizes = [] if batch is None else ["--batch", str(batch)]
        run([EXE, "validate", model, "--runtimes", runtimes, *sizes, "--bench", str(bench),
             "--report", report, *extra])
        with open(report) as f:
            return json.load(f)
    finally:
        os.unlink(report)


def median(report, name):
    return next(r for r in report["runtimes"] if r["name"] == name)["bench"]["median_ms"]


def runtime(report, name):
    return next(r for r in report["runtimes"] if r["name"] == name)


def metadata_flops(model):
    out = run([EXE, "inspect", model, "--json"])
    return int(json.loads(out.stdout)["flops_per_example"])


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    rustc = run(["rustc", "--version"]).stdout.strip()
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, {platform.system()} {platform.release()}; {rustc}"


def ort_library():
    """What ONNX Runtime was measured: its version and the package it came from (a path on
    this machine would say nothing to a reader of BENCHMARKS.md)."""
    path = os.environ.get("ORT_DYLIB_PATH")
    if not path:
        return "the library gmlp-onnx finds (ORT_DYLIB_PATH unset; see `gmlp-onnx doctor`)"
    name = os.path.basename(path)
    version = name.split(".so.", 1)[1] if ".so." in name else "of unknown version"
    capi = os.path.dirname(path)
    site = os.path.dirname(os.path.dirname(capi))
    if os.path.basename(capi) == "capi" and os.path.basename(os.path.dirname(capi)) == "onnxruntime":
        # The wheel that installed the package (onnxruntime-X or onnxruntime_gpu-X .dist-info).
        for entry in sorted(os.listdir(site)):
            if entry.startswith("onnxruntime") and entry.endswith(".dist-info"):
                wheel, _, wheel_version = entry[: -len(".dist-info")].partition("-")
                return f"{version}, the library of the PyPI wheel {wheel.replace('_', '-')}=={wheel_version} (`{name}`)"
    return f"{version} (`{name}`, given by ORT_DYLIB_PATH)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=None)
    ap.add_argument("--peer-python", default=None, help="Python with torch, g-mlp-pytorch, safetensors")
    ap.add_argument("--quick", action="store_true", help="fewer runs and presets (smoke test)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per measurement")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="gmlp-bench-")
    os.makedirs(work, exist_ok=True)
    reps = 2 if a.quick else a.reps
    def say(line):
        print(line, flush=True)  # streamed, so a failure late in the run keeps the rest

    say("# Benchmarks")
    say("")
    say(f"Date: {datetime.date.today()}. Machine: {machine()}. ONNX Runtime: {ort_library()}.")
    say("Produced by `python3 bench/run.py` in one run; latencies are medians of `gmlp-onnx validate --bench` "
        f"({reps} timed runs after one warm-up), and every latency row's runtimes agreed within the default tolerance.")
    say("")

    # 1. Peak.
    mm = os.path.join(work, "matmul.onnx")
    run([MATMUL, mm, "2048"])
    rep = validate(mm, "ort-cpu,tract", 1, reps)
    peak = {n: 2 * 2048**3 / (median(rep, n) / 1e3) / 1e9 for n in ("ort-cpu", "tract")}
    say("## Machine f32 matmul peak (2048 x 2048 x 2048, one MatMul node)")
    say("")
    say("| runtime | median ms | GFLOP/s |")
    say("|---|---|---|")
    for n in ("ort-cpu", "tract"):
        say(f"| {n} | {median(rep, n):.1f} | {peak[n]:.0f} |")
    say("")

    # 2. Build time and RSS vs copy.
    say("## Build time and peak RSS vs a plain copy of the same bytes")
    say("")
    say("| preset | file(s) MB | build s | build peak RSS MB | cp s | build / cp |")
    say("|---|---|---|---|---|---|")
    presets = ["gmlp-ti16", "amlp-base"] if a.quick else ALL_PRESETS
    for p in presets:
        out = os.path.join(work, f"{p}.onnx")
        secs, rss = timed([EXE, "build", "--preset", p, "-o", out, "-q"])
        files = [out] + ([out + ".data"] if os.path.exists(out + ".data") else [])
        size = sum(os.path.getsize(f) for f in files)
        t0 = time.perf_counter()
        for f in files:
            shutil.copyfile(f, f + ".copy")
            with open(f + ".copy", "rb+") as g:
                os.fsync(g.fileno())
        cp = time.perf_counter() - t0
        # The build syncs its output too (write, fsync, rename), so both sides include the flush.
        say(f"| {p} | {size / 1e6:.0f} | {secs:.2f} | {rss / 1024:.0f} | {cp:.2f} | {secs / cp:.2f} |")
        for f in files:
            os.unlink(f + ".copy")
        if p in ("gmlp-large", "amlp-large", "gmlp-xlarge"):
            for f in files:
                os.unlink(f)
    say("")

    # 3. Latency.
    say("## Latency: ONNX Runtime CPU and tract")
    say("")
    say("FLOPs per example as `inspect` reports them (blocks only, the paper's convention); GFLOP/s = FLOPs x batch / median.")
    say("")
    say("| preset | n | batch | ort-cpu ms | ort GFLOP/s | tract ms | tract GFLOP/s | tract / ort |")
    say("|---|---|---|---|---|---|---|---|")
    cases = []
    for p in (["gmlp-ti16", "amlp-base"] if a.quick else VISION_PRESETS + TOKEN_PRESETS):
        if p in VISION_PRESETS:
            cases.append((p, 196, []))
        else:
            for n in (128, 512):
                cases.append((p, n, ["--seq-len", str(n)]))
    for p, n, flags in cases:
        model = os.path.join(work, f"lat-{p}-{n}.onnx")
        run([EXE, "build", "--preset", p, *flags, "-o", model, "-q"])
        flops = metadata_flops(model)
        for batch in (1, 8):
            rep = validate(model, "ort-cpu,tract", batch, reps)
            o, t = median(rep, "ort-cpu"), median(rep, "tract")
            say(f"| {p} | {n} | {batch} | {o:.1f} | {flops * batch / o / 1e6:.0f} | {t:.1f} | "
                f"{flops * batch / t / 1e6:.0f} | {t / o:.2f} |")
        os.unlink(model)
    say("")

    # 4. Gather vs expand.
    say("## toeplitz-gather vs toeplitz-expand (amlp-base, n = 512, batch 1)")
    say("")
    say("| form | file MB | ort load ms | tract load ms | ort-cpu ms | tract ms |")
    say("|---|---|---|---|---|---|")
    for form in ("toeplitz-gather", "toeplitz-expand"):
        model = os.path.join(work, f"amlp-{form}.onnx")
        run([EXE, "build", "--preset", "amlp-base", "--spatial", form, "-o", model, "-q"])
        rep = validate(model, "ort-cpu,tract", 1, reps)
        say(f"| {form} | {os.path.getsize(model) / 1e6:.0f} | {runtime(rep, 'ort-cpu')['load_ms']:.0f} | "
            f"{runtime(rep, 'tract')['load_ms']:.0f} | {median(rep, 'ort-cpu'):.0f} | {median(rep, 'tract'):.0f} |")
        os.unlink(model)
    say("")

    # 5. Peer.
    say("## Ours vs torch.onnx.export (g-mlp-pytorch aMLP: d_model 512, d_ffn 3072, attention 64, n = 256, 36 blocks)")
    say("")
    if not a.peer_python:
        say("Skipped: no --peer-python given.")
    else:
        peer_dir = os.path.join(work, "peer")
        run([a.peer_python, os.path.join(ROOT, "bench", "make_peer.py"), peer_dir])
        ours = os.path.join(peer_dir, "ours.onnx")
        run([EXE, "build", "--weights", os.path.join(peer_dir, "amlp.safetensors"), "-o", ours, "-q"])
        peer = os.path.join(peer_dir, "peer.onnx")
        check = ["--inputs", os.path.join(peer_dir, "inputs.npz"), "--expected", os.path.join(peer_dir, "expected.npz")]
        times = {"ours": [], "peer": []}
        agree = {}
        for _ in range(2 if a.quick else 3):  # alternate ABAB so drift hits both
            for name, model in (("ours", ours), ("peer", peer)):
                rep = validate(model, "ort-cpu", None, reps, check)
                times[name].append(median(rep, "ort-cpu"))
                agree[name] = max(o["max_rel"] for p in rep["pairs"] for o in p["outputs"])
        o, p = sorted(times["ours"])[len(times["ours"]) // 2], sorted(times["peer"])[len(times["peer"]) // 2]
        say("| model | ONNX Runtime CPU ms (median of medians) | max rel vs PyTorch |")
        say("|---|---|---|")
        say(f"| ours (`gmlp-onnx build --weights`) | {o:.1f} | {agree['ours']:.1e} |")
        say(f"| torch.onnx.export, opset 17 | {p:.1f} | {agree['peer']:.1e} |")
        say("")
        say(f"Latency ratio ours / peer: **{o / p:.2f}**.")
    say("")


if __name__ == "__main__":
    main()
