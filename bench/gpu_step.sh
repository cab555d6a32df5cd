#!/usr/bin/env bash
# The decode step's GPU figures in one run, before and after side by side: the step of
# amlp-base --layers 6 --causal --with-past --target ort-gpu as 0.5.0 wrote it (OLD_BIN) and
# as this version writes it (NEW_BIN, the fused step), f32 and int4:
#   - ONNX Runtime's own replay of each file (bench/gpu_decode.py ort: state in place on the
#     device, with and without CUDA graphs), batch 1, 8 and 64;
#   - `gmlp-onnx generate --runtime ort-cuda` (NEW_BIN) on each file, batch 1, 8 and 64;
#   - CUDA kernels per step (bench/gpu_decode.py kernels: torch.profiler, no graph) and nodes
#     per step after ONNX Runtime's fusions (bench/step_nodes.py, CPU provider);
#   - onnxruntime-genai-cuda on the default file's genai folder, with and without
#     enable_cuda_graph, next to `generate` (bench/genai_decode.py), when it imports.
# About 4 minutes on an H200. The environment must load onnxruntime-gpu as for
# bench/gpu_decode.sh (../shared/gpu/unpack.sh).
#
# Usage: bench/gpu_step.sh NEW_BIN OLD_BIN OUT_DIR
#   NEW_BIN, OLD_BIN  release binaries (default `cuda` feature) of this version and of 0.5.0
#                     (`git worktree add ../gmlp-0.5.0 a032e98 && cargo build --release` there);
#                     OLD_BIN only builds the 0.5.0 files, NEW_BIN decodes both.
set -uo pipefail
new=$1 old=$2 out=$3
# GPU_DECODE_RUNTIME=ort-cpu GPU_DECODE_DEVICE=cpu GPU_STEP_BATCHES=1,2 is a dry run on a CPU.
rt=${GPU_DECODE_RUNTIME:-ort-cuda}
batches=${GPU_STEP_BATCHES:-1,8,64}
here=$(cd "$(dirname "$0")" && pwd)
m=$out/models
mkdir -p "$m" "$out/json"
exec > >(tee -a "$out/log.txt") 2>&1
step() { # step NAME CMD...: run, log the exit code
  local name=$1; shift
  echo "=== $name" >&2; local t0=$SECONDS
  "$@"; local rc=$?
  echo "=== $name: exit $rc in $((SECONDS - t0)) s" >&2; echo "$name $rc" >> "$out/exit_codes.txt"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$new" --version; "$old" --version
flags=(--preset amlp-base --layers 6 --causal --with-past --target ort-gpu -q)
for dtype in f32 int4; do
  step "build-old-$dtype" "$old" build "${flags[@]}" --dtype $dtype -o "$m/old-$dtype.onnx"
  step "build-new-$dtype" "$new" build "${flags[@]}" --dtype $dtype -o "$m/new-$dtype.onnx"
done
step nodes python3 "$here/step_nodes.py" --json "$m"/old-f32.onnx "$m"/new-f32.onnx "$m"/old-int4.onnx \
  "$m"/new-int4.onnx > "$out/nodes.json"
step kernels python3 "$here/gpu_decode.py" kernels "$m/old-f32.onnx" "$m/new-f32.onnx" \
  --batches "$batches" > "$out/kernels.json"
step ort python3 "$here/gpu_decode.py" ort --static "$m/old-f32.onnx" --static "$m/new-f32.onnx" \
  --static "$m/old-int4.onnx" --static "$m/new-int4.onnx" --prompt 448 --steps 64 \
  --batches "$batches" > "$out/ort.json"
prompt=$(python3 -c "print(','.join(str((i * 7919) % 32000) for i in range(448)))")
more=$(tr , ' ' <<<"$batches" | xargs -n1 | grep -vx 1 | xargs)
for b in $more; do
  python3 -c "
for s in range($b):
    print(','.join(str((i * 7919 + s * 131) % 32000) for i in range(448)))" > "$out/prompts$b.txt"
done
for round in 1 2; do  # alternating old, new: machines are noisy
  for tag in old-f32 new-f32 old-int4 new-int4; do
    step "generate-$tag-b1-r$round" "$new" generate "$m/$tag.onnx" --prompt-ids "$prompt" \
      --max-new-tokens 64 --runtime $rt --json -q > "$out/json/$tag-b1-r$round.json"
    for b in $more; do
      step "generate-$tag-b$b-r$round" "$new" generate "$m/$tag.onnx" --prompts-file "$out/prompts$b.txt" \
        --max-new-tokens 64 --runtime $rt --json -q > "$out/json/$tag-b$b-r$round.json"
    done
  done
done
step compare "$new" generate "$m/new-f32.onnx" --prompts-file "$out/prompts${more%% *}.txt" --max-new-tokens 16 \
  --compare ort-cpu,$rt --json -q > "$out/json/compare-new-f32.json"
ort_capi=$(python3 -c "import os, onnxruntime; print(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi'))" 2>/dev/null)
if [ -n "$ort_capi" ] && [ -n "${ORT_DYLIB_PATH:-}" ] && ! ls "$ort_capi"/libonnxruntime.so* >/dev/null 2>&1; then
  ln -sf "$ORT_DYLIB_PATH" "$ort_capi/"
fi
# The genai folder's step captured by ONNX Runtime alone (fed as genai feeds it): tells a
# graph that cannot be captured from a genai loop that cannot capture it; the log has ONNX
# Runtime's words on node placement.
if [ "${GPU_DECODE_DEVICE:-cuda}" = cuda ]; then
  step genai-folder "$new" build --preset amlp-base --layers 6 --causal --with-past -q \
    -o "$m/default.onnx" --genai-dir "$m/genai-capture"
  step genai-capture python3 "$here/gpu_decode.py" genai-capture "$m/genai-capture" > "$out/genai_capture.json"
fi
if python3 -c "import onnxruntime_genai" 2>/dev/null; then
  step genai python3 "$here/genai_decode.py" "$new" "$m/genai" --device "${GPU_DECODE_DEVICE:-cuda}" \
    --rounds 2 > "$out/genai.json"
else
  echo "=== genai: onnxruntime_genai not importable, skipped" >&2
fi
python3 - "$out" "$batches" <<'PY'
import glob, json, os, statistics, sys
d, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
def load(f):  # a step that failed left an empty or partial file: its figures are absent
    try:
        return json.load(open(os.path.join(d, f)))
    except (OSError, ValueError):
        return {}
ort_, kern, nodes = load("ort.json"), load("kernels.json"), load("nodes.json")
for path, c in nodes.items():
    print(f"nodes after ONNX Runtime's fusions, {os.path.basename(path)}: {c['total']}")
for k, v in kern.items():
    if "kernels_per_step" in k or "error" in k:
        print(f"kernels: {k}: {v}")
print(f"{'step':28} {'ORT replay ms (no graph)':>25} {'(graph)':>9} {'generate ms (median)':>22} {'tokens/s':>10}")
for tag in ["old-f32", "new-f32", "old-int4", "new-int4"]:
    for b in batches:
        runs = [json.load(open(f))[0] for f in glob.glob(os.path.join(d, "json", f"{tag}-b{b}-r*.json"))
                if os.path.getsize(f)]
        ms = statistics.median([r["step_median_ms"] for r in runs]) if runs else None
        o, g = ort_.get(f"{tag}_b{b}_nograph_step_ms"), ort_.get(f"{tag}_b{b}_graph_step_ms")
        tps = b / ms * 1e3 if ms else None
        f = lambda v, p: "-" if v is None else f"{v:.{p}f}"
        print(f"{tag + ' batch ' + str(b):28} {f(o, 3):>25} {f(g, 3):>9} {f(ms, 3):>22} {f(tps, 0):>10}")
def ours(tag, b):
    runs = [json.load(open(f))[0] for f in glob.glob(os.path.join(d, "json", f"{tag}-b{b}-r*.json"))
            if os.path.getsize(f)]
    return statistics.median([r["step_median_ms"] for r in runs]) if runs else None
for b in batches:
    o, n, g = ort_.get(f"old-f32_b{b}_graph_step_ms"), ort_.get(f"new-f32_b{b}_graph_step_ms"), ours("new-f32", b)
    if o and n:
        print(f"f32 batch {b}: ONNX Runtime's replay, new file / old file = {n / o:.3f}")
    if o and g:
        print(f"f32 batch {b}: generate on the new file / ONNX Runtime's replay of the old file = {g / o:.3f}"
              + (" (goal <= 0.6)" if b == 1 else ""))
    if g:
        goal = {8: 15000, 64: 40000}.get(b)
        print(f"f32 batch {b}: generate {b / g * 1e3:.0f} tokens/s" + (f" (goal >= {goal})" if goal else ""))
for f in sorted(glob.glob(os.path.join(d, "json", "*-r1.json"))):
    runs = load(os.path.join("json", os.path.basename(f)))
    if runs and runs[0].get("note"):  # e.g. "CUDA graphs off: ..." (a node ONNX Runtime kept on the CPU)
        print(f"note of {os.path.basename(f)}: {runs[0]['note']}")
comp = load("json/compare-new-f32.json")
if comp:
    toks = {r["runtime"]: r["tokens"] for r in comp}
    first = next(iter(toks.values()))
    print("tokens of the new file: " + ("equal in " + ", ".join(toks) if all(t == first for t in toks.values()) else f"DIFFER {toks}"))
for k, v in load("genai_capture.json").items():
    print(f"genai folder captured by ONNX Runtime alone: {k}: {v}")
genai = load("genai.json")
for k, v in genai.items():
    print(f"genai {k}: {v}")
PY
echo "exit codes:"; cat "$out/exit_codes.txt"
