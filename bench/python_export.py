"""Exporting a g-mlp-pytorch aMLP from Python: gmlp_onnx.export beside torch.onnx.export
(dynamo and TorchScript) and beside writing the file's bytes alone; and, with --generator,
a gmlp_onnx.Generator step beside the command's (`gmlp-onnx generate`).

Every measurement runs in a fresh subprocess (so its peak RSS is its own: VmHWM at the end,
reset once the module is built, against the RSS then, before the export starts), the kinds alternating
within each round (A B C D A B C D ...) so that the load of a shared machine hits them
alike; the table gives medians over the rounds.

  (a) gmlp      gmlp_onnx.export(module, path)
  (b) dynamo    torch.onnx.export(module, (ids,), path, dynamo=True)   (needs onnxscript)
  (c) script    torch.onnx.export(module, (ids,), path, dynamo=False)  (TorchScript)
  (d) write     the bytes of (a)'s file written alone: a temporary file beside the target,
                one write, fsync, rename (the issue's baseline: the bytes as a user writes them)
  (e) streamed  the same bytes written as src/fs.rs writes a file: 512 KB writes, the
                kernel asked to start writeback every 8 MB (sync_file_range, Linux), fsync,
                rename: the disk's limit when writeback overlaps the writing

Usage:
  python bench/python_export.py [--sizes small,mid-28m,amlp-base] [--rounds 3]
                                [--kinds gmlp,dynamo,script,write,streamed] [--timeout 900]
  python bench/python_export.py --generator [--sizes mid-28m] [--rounds 5]
                                [--new-tokens 64] [--threads 1]

Sizes (g-mlp-pytorch gMLP, bidirectional unless --generator, which builds them causal):
  small      4 blocks, d 256, f 1024, n 128, attn 32, vocab 8192
  mid-28m  12 blocks, d 512, f 2048, n 256, attn 64, vocab 6144 (~28M parameters)
  amlp-base  36 blocks, d 512, f 3072, n 512, attn 64, vocab 32000 (the amlp-base preset)
Bench helper only: needs torch, g-mlp-pytorch, gmlp_onnx (for gmlp, write, --generator).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# bench/ holds triton.py (a bench of its own), which would shadow the triton package that
# torch's dynamo exporter imports: this script needs nothing from its folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

SIZES = {
    "small": dict(num_tokens=8192, dim=256, depth=4, seq_len=128, ff_mult=4, attn_dim=32),
    "mid-28m": dict(num_tokens=6144, dim=512, depth=12, seq_len=256, ff_mult=4, attn_dim=64),
    "amlp-base": dict(num_tokens=32000, dim=512, depth=36, seq_len=512, ff_mult=6, attn_dim=64),
}
KINDS = ("gmlp", "dynamo", "script", "write", "streamed")
# src/fs.rs: the writer's run (tensor::RUN floats) and its WRITEBACK_STEP.
RUN_BYTES = 1 << 19
WRITEBACK_STEP = 8 << 20


# ---------------------------------------------------------------------------------------
# Worker: one measurement in this (fresh) process


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    """Starts VmHWM again from the current RSS (Linux's clear_refs 5), so that a kind's peak
    is its own and not the module build's temporaries."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def build(size: str, causal: bool = False):
    import torch
    from g_mlp_pytorch import gMLP

    torch.manual_seed(0)
    m = gMLP(**SIZES[size], causal=causal)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return m.eval()


def worker(kind: str, size: str, out: str, source: str) -> dict:
    """Times one kind; returns seconds, file bytes, RSS before and peak RSS (kB)."""
    result = {"kind": kind, "size": size}
    if kind in ("write", "streamed"):
        with open(source, "rb") as f:
            data = f.read()
        start_writeback = _sync_file_range() if kind == "streamed" else None
        _reset_peak()
        rss = _status_kb("VmRSS")
        start = time.perf_counter()
        tmp = out + ".tmp"
        with open(tmp, "wb") as f:
            if start_writeback is None:
                f.write(data)
                f.flush()
            else:
                fd, view, written, requested = f.fileno(), memoryview(data), 0, 0
                while written < len(data):
                    written += os.write(fd, view[written:written + RUN_BYTES])
                    if written - requested >= WRITEBACK_STEP:
                        start_writeback(fd, requested, written - requested)
                        requested = written
            os.fsync(f.fileno())
        os.replace(tmp, out)
        seconds = time.perf_counter() - start
    else:
        import torch

        m = build(size)
        params = sum(p.numel() * p.element_size() for p in m.parameters())
        result["param_bytes"] = params
        ids = torch.randint(0, SIZES[size]["num_tokens"], (1, SIZES[size]["seq_len"]))
        if kind == "gmlp":
            import gmlp_onnx  # imported before the clock starts, as torch is
        _reset_peak()
        rss = _status_kb("VmRSS")
        start = time.perf_counter()
        if kind == "gmlp":
            gmlp_onnx.export(m, out)
        elif kind == "dynamo":
            torch.onnx.export(m, (ids,), out, dynamo=True, input_names=["input_ids"], output_names=["logits"])
        elif kind == "script":
            torch.onnx.export(m, (ids,), out, dynamo=False, input_names=["input_ids"], output_names=["logits"])
        else:
            raise SystemExit(f"unknown kind {kind}")
        seconds = time.perf_counter() - start
    result.update(seconds=seconds, rss_before_kb=rss, peak_kb=_status_kb("VmHWM"), file_bytes=_file_bytes(out))
    return result


def _sync_file_range():
    """libc's sync_file_range(fd, offset, len, SYNC_FILE_RANGE_WRITE) (Linux), as src/fs.rs calls it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    call = libc.sync_file_range
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    write = 2  # SYNC_FILE_RANGE_WRITE

    def start_writeback(fd: int, offset: int, length: int) -> None:
        if call(fd, offset, length, write) != 0:
            raise OSError(ctypes.get_errno(), "sync_file_range")

    return start_writeback


def _file_bytes(path: str) -> int:
    """The model file and its external data beside it (torch writes PATH.data past 2 GiB)."""
    total = os.path.getsize(path) if os.path.exists(path) else 0
    for extra in (path + ".data", os.path.splitext(path)[0] + ".onnx.data"):
        if extra != path and os.path.exists(extra):
            total += os.path.getsize(extra)
    return total


# ---------------------------------------------------------------------------------------
# Driver


def run_worker(kind: str, size: str, out: str, source: str, timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--size", size, "--out", out, "--source", source]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"kind": kind, "size": size, "error": f"timeout after {timeout:.0f} s"}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        return {"kind": kind, "size": size, "error": last[:160]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def median(results, key):
    values = [r[key] for r in results if key in r]
    return statistics.median(values) if values else None


def export_bench(a) -> int:
    kinds = [k for k in a.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            raise SystemExit(f"--kinds: {k} is none of {', '.join(KINDS)}")
    sizes = [s for s in a.sizes.split(",") if s]
    for s in sizes:
        if s not in SIZES:
            raise SystemExit(f"--sizes: {s} is none of {', '.join(SIZES)}")
    rows = []
    with tempfile.TemporaryDirectory(dir=a.workdir) as work:
        for size in sizes:
            results = {k: [] for k in kinds}
            paths = {k: os.path.join(work, f"{size}.{k}.onnx") for k in kinds}
            source_kind = None
            for r in range(a.rounds):
                for kind in kinds:
                    source = ""
                    if kind in ("write", "streamed"):
                        # (d) writes the bytes of (a)'s file; without one, of torch's.
                        source_kind = next((k for k in ("gmlp", "script", "dynamo")
                                            if k in paths and os.path.exists(paths[k])), None)
                        if source_kind is None:
                            results[kind].append({"kind": kind, "error": "no exported file to write"})
                            continue
                        source = paths[source_kind]
                    res = run_worker(kind, size, paths[kind], source, a.timeout)
                    if kind in ("write", "streamed"):
                        res["source"] = source_kind
                    results[kind].append(res)
                    shown = f"{res['seconds']:.2f} s" if "seconds" in res else res["error"]
                    print(f"  round {r + 1} {size} {kind}: {shown}", file=sys.stderr, flush=True)
            if source_kind is None:
                source_kind = next((k for k in ("gmlp", "script", "dynamo") if k in kinds), None)
            rows.append((size, results, source_kind))
            for path in paths.values():  # keep the disk for the next size
                for f in (path, path + ".data"):
                    if os.path.exists(f):
                        os.remove(f)
    print_table(rows, kinds)
    if a.json:
        print(json.dumps([{"size": s, "results": r} for s, r, _ in rows], indent=2))
    return 0


def print_table(rows, kinds) -> None:
    mb = 1e6
    print()
    print(f"{'size':<10} {'params MB':>9} {'file MB':>8}  " + "  ".join(f"{k + ' s':>9} {k + ' peakMB':>12} {'(+MB)':>7}" for k in kinds))
    for size, results, source_kind in rows:
        params = next((r["param_bytes"] for rs in results.values() for r in rs if "param_bytes" in r), 0)
        file_bytes = median(results.get(source_kind, []), "file_bytes") if source_kind else None
        cells = []
        med = {}
        for k in kinds:
            s = median(results[k], "seconds")
            peak = median(results[k], "peak_kb")
            before = median(results[k], "rss_before_kb")
            med[k] = s
            errs = [r["error"] for r in results[k] if "error" in r]
            if s is None:
                cells.append(f"{(errs[0] if errs else 'n/a')[:31]:>31}")
            else:
                extra = (peak - before) / 1e3 if peak is not None and before is not None else float("nan")
                cells.append(f"{s:>9.2f} {peak / 1e3:>12.0f} {extra:>7.0f}")
        print(f"{size:<10} {params / mb:>9.1f} {(file_bytes or 0) / mb:>8.1f}  " + "  ".join(cells))
        ratios = []
        if "write" in med and source_kind != "gmlp":
            print(f"{'':<10} (write: the bytes of the {source_kind} file)")
        for num, den, what in (("gmlp", "write", "export / write-alone"),
                               ("gmlp", "streamed", "export / streamed write"),
                               ("dynamo", "gmlp", "dynamo / export"),
                               ("script", "gmlp", "torchscript / export")):
            if med.get(num) and med.get(den):
                ratios.append(f"{what} {med[num] / med[den]:.2f}x")
        if ratios:
            print(f"{'':<10} " + ", ".join(ratios))
    print("(medians over the rounds; peakMB: VmHWM of the measuring process, reset once the module was built; +MB: above its RSS then)")


# ---------------------------------------------------------------------------------------
# --generator: a Generator step beside the command's


def gmlp_cli() -> str:
    import shutil

    beside = os.path.join(os.path.dirname(sys.executable), "gmlp-onnx")
    found = beside if os.path.exists(beside) else shutil.which("gmlp-onnx")
    if not found:
        raise SystemExit("no gmlp-onnx command beside python or on PATH")
    return found


def generator_bench(a) -> int:
    import gmlp_onnx

    size = a.sizes.split(",")[0]
    if size not in SIZES:
        raise SystemExit(f"--sizes: {size} is none of {', '.join(SIZES)}")
    exe = gmlp_cli()
    prompt = [(7 * i + 3) % SIZES[size]["num_tokens"] for i in range(8)]
    new = min(a.new_tokens, SIZES[size]["seq_len"] - len(prompt))
    with tempfile.TemporaryDirectory(dir=a.workdir) as work:
        path = os.path.join(work, f"{size}.causal.onnx")
        gmlp_onnx.export(build(size, causal=True), path, with_past="static")
        ours, theirs, same = [], [], True
        # The Generator in a fresh interpreter that imports gmlp_onnx alone (torch's threads,
        # left spinning by the export, and its memory are not the step's to carry).
        timing = (
            "import json, statistics, sys, time, gmlp_onnx\n"
            f"gen = gmlp_onnx.Generator({path!r}, runtime={a.runtime!r}, threads={a.threads})\n"
            "stamps, tokens = [], []\n"
            f"for t in gen.stream({prompt!r}, max_new_tokens={new}):\n"
            "    stamps.append(time.perf_counter()); tokens.append(t)\n"
            "steps = [y - x for x, y in zip(stamps, stamps[1:])]\n"
            "print(json.dumps({'step_ms': statistics.median(steps) * 1e3, 'tokens': tokens}))\n"
        )
        for r in range(a.rounds):
            p = subprocess.run([sys.executable, "-c", timing], capture_output=True, text=True, timeout=a.timeout)
            if p.returncode != 0:
                raise SystemExit(f"the Generator failed: {p.stderr.strip()}")
            measured = json.loads(p.stdout)
            ours.append(measured["step_ms"])
            tokens = measured["tokens"]
            p = subprocess.run([exe, "generate", path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens",
                                str(new), "--runtime", a.runtime, "--threads", str(a.threads), "--json", "-q"],
                               capture_output=True, text=True, timeout=a.timeout)
            if p.returncode != 0:
                raise SystemExit(f"gmlp-onnx generate failed: {p.stderr.strip()}")
            report = json.loads(p.stdout)[0]
            theirs.append(report["step_median_ms"])
            same &= report["tokens"] == tokens
            print(f"  round {r + 1}: Generator step {ours[-1]:.3f} ms, command step {theirs[-1]:.3f} ms",
                  file=sys.stderr, flush=True)
    g, c = statistics.median(ours), statistics.median(theirs)
    print(f"{size} causal, static state, {a.runtime}, threads {a.threads}, prompt {len(prompt)}, {new} new tokens, "
          f"{a.rounds} rounds")
    print(f"Generator step median {g:.3f} ms, command step median {c:.3f} ms: ratio {g / c:.3f}"
          f"{'' if same else ' (TOKENS DIFFER)'}")
    return 0 if same else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=None, help="comma-separated: " + ", ".join(SIZES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds allowed to one measurement")
    ap.add_argument("--workdir", default=None, help="folder for the files (default: the system's temp)")
    ap.add_argument("--json", action="store_true", help="also print every measurement as JSON")
    ap.add_argument("--generator", action="store_true", help="time a Generator step against the command's")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runtime", default="ort-cpu")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--size", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--source", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if a.worker:
        print(json.dumps(worker(a.worker, a.size, a.out, a.source)))
        return 0
    if a.generator:
        a.sizes = a.sizes or "mid-28m"
        return generator_bench(a)
    a.sizes = a.sizes or ",".join(SIZES)
    return export_bench(a)


if __name__ == "__main__":
    sys.exit(main())
