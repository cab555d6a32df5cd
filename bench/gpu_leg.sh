#!/usr/bin/env bash
# The CUDA leg on a real GPU (docs/runtimes.md, "Run on a GPU"): tract (CPU) vs ONNX
# Runtime's CUDA execution provider on the models listed there, with and without TF32, with
# --cuda-no-cpu-fallback, --bench latency per runtime, placement counts from ONNX Runtime's profile (in each JSON report),
# the decoding check of a with-past model and `generate --runtime ort-cuda`.
#
# Usage: bench/gpu_leg.sh BIN ORT_LIB MODELS_DIR OUT_DIR [PART]
#   BIN         a gmlp-onnx release binary (built with the default `cuda` feature)
#   ORT_LIB     libonnxruntime.so.1.31.1 of PyPI's onnxruntime-gpu 1.31.1 (its
#               libonnxruntime_providers_{shared,cuda}.so beside it)
#   MODELS_DIR  where the models are built (kept between parts)
#   OUT_DIR     where logs, JSON reports and the summary go
#   PART        a (machine, doctor, builds, f32 models), b (f16, int8, with-past, generate)
#               or all (default); each part fits a 10-minute window on an H100 machine
# CUDA 13 and cuDNN 9 must come from the nvidia-* wheels of the Python that runs the script
# (`python3`): their lib/ folders go on LD_LIBRARY_PATH exactly as docs/runtimes.md's recipe says.
# Every step runs even if an earlier one fails; each step's exit code is logged.
set -uo pipefail
bin=$1 ort=$2 m=$3 out=$4 part=${5:-all}
mkdir -p "$out/reports" "$m"
log="$out/log.txt"
exec > >(tee -a "$log") 2>&1
export ORT_DYLIB_PATH=$ort
# docs/runtimes.md's recipe: every lib/ folder of the nvidia-* wheels on the loader path.
LD_LIBRARY_PATH=$(python3 -c "import glob, os, site; print(':'.join(sorted({os.path.dirname(p) for p in glob.glob(os.path.join(site.getsitepackages()[0], 'nvidia', '**', 'lib*.so*'), recursive=True)})))")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH

step() { # step NAME CMD...: run, log the exit code
  local name=$1; shift
  local cmd="$*"; echo "=== $name: ${cmd:0:240}"
  local t0=$SECONDS
  "$@"
  local rc=$?
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  echo "$name $rc" >> "$out/exit_codes.txt"
}

if [ "$part" != b ]; then
echo "=== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
nvidia-smi | head -4
nproc; uname -r
python3 -m pip list 2>/dev/null | grep -i -E '^(nvidia-(cublas|cuda-runtime|cudnn|cufft|curand|cuda-nvrtc))' || true
"$bin" --version

step doctor "$bin" doctor

step build-ti16 "$bin" build --preset gmlp-ti16 -o "$m/gmlp-ti16.onnx" --quiet
step build-ti16-f16 "$bin" build --preset gmlp-ti16 --dtype f16 -o "$m/gmlp-ti16-f16.onnx" --quiet
step build-amlp "$bin" build --preset amlp-base -o "$m/amlp-base.onnx" --quiet
step build-amlp-f16 "$bin" build --preset amlp-base --dtype f16 -o "$m/amlp-base-f16.onnx" --quiet
step build-past "$bin" build --preset amlp-base --layers 6 --causal --with-past -o "$m/amlp-base-6-past.onnx" --quiet
step build-ti16-int8 "$bin" build --preset gmlp-ti16 --dtype int8 -o "$m/gmlp-ti16-int8.onnx" --quiet

fi
r=$out/reports
validate_three() { # MODEL BENCH: all three runtimes, TF32 on, no CPU fallback
  local model=$1 n=$2
  step "$model" "$bin" validate "$m/$model.onnx" --runtimes tract,ort-cpu,ort-cuda --batch 1 --bench "$n" --report "$r/$model.json"
  step "$model-tf32" "$bin" validate "$m/$model.onnx" --runtimes tract,ort-cuda --batch 1 --bench "$n" --tf32 --report "$r/$model-tf32.json"
  step "$model-no-fallback" "$bin" validate "$m/$model.onnx" --runtimes tract,ort-cuda --batch 1 --cuda-no-cpu-fallback --report "$r/$model-no-fallback.json"
}
if [ "$part" != b ]; then
validate_three gmlp-ti16 20
validate_three amlp-base 10
# Batch 8 at n = 512: where a GPU pays.
step amlp-base-b8 "$bin" validate "$m/amlp-base.onnx" --runtimes ort-cpu,ort-cuda --batch 8 --bench 10 --report "$r/amlp-base-b8.json"
step amlp-base-b8-tf32 "$bin" validate "$m/amlp-base.onnx" --runtimes ort-cpu,ort-cuda --batch 8 --bench 10 --tf32 --report "$r/amlp-base-b8-tf32.json"
fi
if [ "$part" != a ]; then
validate_three gmlp-ti16-f16 10
validate_three amlp-base-f16 5
# int8 (DynamicQuantizeLinear/MatMulInteger): where do its nodes run?
step gmlp-ti16-int8 "$bin" validate "$m/gmlp-ti16-int8.onnx" --runtimes tract,ort-cuda --batch 1 --bench 10 --report "$r/gmlp-ti16-int8.json"
# With-past: whole-sequence agreement plus the decoding check (prefill 256, 8 steps, a chunk).
step past "$bin" validate "$m/amlp-base-6-past.onnx" --runtimes tract,ort-cpu,ort-cuda --batch 1 --report "$r/amlp-base-6-past.json"
step past-tf32 "$bin" validate "$m/amlp-base-6-past.onnx" --runtimes tract,ort-cuda --batch 1 --tf32 --report "$r/amlp-base-6-past-tf32.json"
prompt=$(python3 -c "print(','.join(str((i * 7919) % 32000) for i in range(448)))")
for rt in ort-cuda ort-cpu; do
  step "generate-$rt" "$bin" generate "$m/amlp-base-6-past.onnx" --prompt-ids "$prompt" --max-new-tokens 64 --runtime "$rt" --json -q
done
step generate-compare "$bin" generate "$m/amlp-base-6-past.onnx" --prompt-ids "$prompt" --max-new-tokens 16 --compare tract,ort-cuda -q
fi

echo "=== summary"
python3 - "$r" <<'PY'
import json, glob, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    rep = json.load(open(f))
    name = os.path.basename(f)[:-5]
    rts = ", ".join(
        f"{rt['name']} {(rt.get('bench') or {}).get('median_ms', rt['first_run_ms']):.2f} ms"
        + (f" {rt['providers']}" if rt.get("providers") else "")
        for rt in rep.get("runtimes", []))
    pairs = "; ".join(
        f"{p['reference']}~{p['other']} max_rel {max(o['max_rel'] for o in p['outputs']):.1e}"
        for p in rep.get("pairs", []))
    dec = rep.get("decoding")
    d = f" decoding pass={dec['pass']}" if dec else ""
    print(f"{name}: pass={rep['pass']} | {rts} | {pairs}{d}")
PY
