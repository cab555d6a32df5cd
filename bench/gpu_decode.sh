#!/usr/bin/env bash
# The GPU table of BENCHMARKS.md on one GPU: gmlp-onnx's figures next to ONNX Runtime's own (Python, same
# files), token agreement of ort-cuda with ort-cpu and tract, and the third-party fixtures
# through ort-cuda (vs tract and vs the upstream libraries' outputs). Under 3 minutes on an
# H100. BENCHMARKS.md ("Generation on the GPU") records its output.
#
# Usage: bench/gpu_decode.sh BIN FIXTURES_NPZ OUT_DIR
#   BIN           a gmlp-onnx release binary (default `cuda` feature)
#   FIXTURES_NPZ  `python3 bench/gpu_decode.py fixtures DIR` made here (numpy only)
#   OUT_DIR       logs, JSON and the summary
# The environment must load onnxruntime-gpu 1.31.1: ORT_DYLIB_PATH, LD_LIBRARY_PATH with
# CUDA 13 / cuDNN 9, PYTHONPATH with its Python package (../shared/gpu/unpack.sh does this).
# Every step runs even if an earlier one fails; each step's exit code is logged.
set -uo pipefail
bin=$1 fix=$2 out=$3
# GPU_DECODE_RUNTIME=ort-cpu (with GPU_DECODE_DEVICE=cpu) is a dry run of this script on a CPU.
rt=${GPU_DECODE_RUNTIME:-ort-cuda}
m=${GPU_DECODE_MODELS:-$out/models}
mkdir -p "$m" "$out/json"
exec > >(tee -a "$out/log.txt") 2>&1
here=$(cd "$(dirname "$0")" && pwd)
step() { # step NAME CMD...: run, log the exit code (on stderr: stdout may be a result)
  local name=$1; shift
  echo "=== $name" >&2; local t0=$SECONDS
  "$@"; local rc=$?
  echo "=== $name: exit $rc in $((SECONDS - t0)) s" >&2; echo "$name $rc" >> "$out/exit_codes.txt"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$bin" --version
# amlp-base, 6 blocks, causal, n = 512 (the issue's figures): the variable-length file for the
# whole forward, the static state with ScatterND (target ort) and TensorScatter (ort-gpu).
step build-whole "$bin" build --preset amlp-base --layers 6 --causal -o "$m/whole.onnx" -q
step build-static17 "$bin" build --preset amlp-base --layers 6 --causal --with-past -o "$m/static17.onnx" -q
step build-static24 "$bin" build --preset amlp-base --layers 6 --causal --with-past --target ort-gpu -o "$m/static24.onnx" -q

step ort python3 "$here/gpu_decode.py" ort --whole "$m/whole.onnx" --static "$m/static24.onnx" \
  --static "$m/static17.onnx" --prompt 448 --steps 64 --batches 1,8 > "$out/ort.json"

step validate-bench "$bin" validate "$m/whole.onnx" --runtimes $rt --bench 30 \
  --inputs "$fix/whole.inputs.npz" --report "$out/json/validate.json"
prompt=$(python3 -c "print(','.join(str((i * 7919) % 32000) for i in range(448)))")
python3 -c "
for b in range(8):
    print(','.join(str((i * 7919 + b * 131) % 32000) for i in range(448)))" > "$out/prompts8.txt"
for tag in static24 static17; do
  step "generate-$tag-b1" "$bin" generate "$m/$tag.onnx" --prompt-ids "$prompt" --max-new-tokens 64 \
    --runtime $rt --json -q > "$out/json/generate-$tag-b1.json"
  step "generate-$tag-b8" "$bin" generate "$m/$tag.onnx" --prompts-file "$out/prompts8.txt" \
    --max-new-tokens 64 --runtime $rt --json -q > "$out/json/generate-$tag-b8.json"
done
# Tokens: ort-cuda (device state, CUDA graphs, ArgMax in the step's graph) vs ort-cpu and tract.
step compare-static17 "$bin" generate "$m/static17.onnx" --prompt-ids "$prompt" --max-new-tokens 16 \
  --compare tract,ort-cpu,$rt --json -q > "$out/json/compare-static17.json"
step compare-static24 "$bin" generate "$m/static24.onnx" --prompts-file "$out/prompts8.txt" \
  --max-new-tokens 16 --compare ort-cpu,$rt --json -q > "$out/json/compare-static24.json"

# --device: a device that does not exist is one clear line and exit 3, not a crash or device 0.
"$bin" generate "$m/static17.onnx" --prompt-ids 1,2,3 --max-new-tokens 2 --runtime $rt --device 99 -q \
  > /dev/null 2> "$out/device99.txt"
echo "device-99 $?" >> "$out/exit_codes.txt"
# The same tokens on --device 0 named, with the CUDA graph replayed (the note of --json).
step device-0 "$bin" generate "$m/static17.onnx" --prompt-ids "$prompt" --max-new-tokens 16 \
  --runtime $rt --device 0 --json -q > "$out/json/device0-static17.json"

# onnxruntime-genai-cuda's step on the genai folder of the same static17 model, next to ours
# (bench/genai_decode.py; runs when its Python package can be imported: BENCHMARKS.md says
# how it travels to the GPU machine).
# genai loads libonnxruntime.so* from the onnxruntime Python package's capi folder: where that
# package is one without its libraries (../shared/gpu/'s py.tar.xz), link ORT_DYLIB_PATH there.
ort_capi=$(python3 -c "import os, onnxruntime; print(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi'))" 2>/dev/null)
if [ -n "$ort_capi" ] && [ -n "${ORT_DYLIB_PATH:-}" ] && ! ls "$ort_capi"/libonnxruntime.so* >/dev/null 2>&1; then
  ln -sf "$ORT_DYLIB_PATH" "$ort_capi/" && echo "genai: linked $ORT_DYLIB_PATH into $ort_capi" >&2
fi
if python3 -c "import onnxruntime_genai" 2>/dev/null; then
  step genai python3 "$here/genai_decode.py" "$bin" "$m/genai" --device "${GPU_DECODE_DEVICE:-cuda}" \
    --rounds 3 > "$out/genai.json"
else
  echo "=== genai: onnxruntime_genai not importable, skipped" >&2
fi

# The third-party fixtures: whole forward tract vs ort-cuda and vs the upstream outputs; causal
# ones also with past (the decoding check, then generation on ort-cuda vs upstream's greedy).
python3 - "$fix/fixtures.json" > "$out/fixtures.list" <<'PY'
import json, sys
for name, e in json.load(open(sys.argv[1])).items():
    flags = []
    for k, v in e["flags"].items():
        flags += ["--" + k.replace("_", "-")] + ([] if v is True else [str(v)])
    print(name, " ".join(flags), "|", ",".join(map(str, e.get("greedy_prompt", []))), "|", len(e.get("greedy_tokens", [])))
PY
while IFS= read -r line; do
  name=${line%% *}; rest=${line#* }; flags=${rest%% |*}; tail=${rest#*| }
  gprompt=${tail%% |*}; gcount=${tail##*| }
  src=fixtures/$name/model.safetensors
  # shellcheck disable=SC2086
  step "fixture-$name" "$bin" build --weights "$src" $flags -o "$m/$name.onnx" -q
  step "fixture-$name-validate" "$bin" validate "$m/$name.onnx" --runtimes tract,$rt \
    --inputs "$fix/$name.inputs.npz" --expected "$fix/$name.expected.npz" --report "$out/json/fixture-$name.json"
  if [[ " $flags " == *" --causal "* ]] || [ "$gcount" -gt 0 ]; then
    # shellcheck disable=SC2086
    if "$bin" build --weights "$src" $flags --with-past -o "$m/$name-past.onnx" -q 2>/dev/null; then
      step "fixture-$name-past" "$bin" validate "$m/$name-past.onnx" --runtimes tract,$rt \
        --report "$out/json/fixture-$name-past.json"
      if [ -n "$gprompt" ] && [ "$gcount" -gt 0 ]; then
        "$bin" generate "$m/$name-past.onnx" --prompt-ids "$gprompt" --max-new-tokens "$gcount" \
          --runtime $rt --json -q > "$out/json/fixture-$name-greedy.json"
      fi
    fi
  fi
done < "$out/fixtures.list"

# Our figures and checks as one JSON, then the table.
python3 - "$out" "$fix/fixtures.json" > "$out/ours.json" <<'PY'
import glob, json, os, sys
d, fixtures = sys.argv[1], json.load(open(sys.argv[2]))
j = lambda f: json.load(open(os.path.join(d, "json", f)))
ours = {}
def find(obj, pred, path=""):  # every leaf that pred accepts, with its JSON path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from find(v, pred, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from find(v, pred, f"{path}[{i}]")
    elif pred(path, obj):
        yield path, obj
try:
    bench = j("validate.json")["runtimes"][0]["bench"]
    ours["validate_host_ms"] = bench["median_ms"]
    ours["validate_device_ms"] = (bench.get("device_resident") or {}).get("median_ms")
except Exception as e:
    ours["validate_error"] = str(e)
for tag in ["static24", "static17"]:
    for b in [1, 8]:
        try:
            g = j(f"generate-{tag}-b{b}.json")[0]
            ours[f"{tag}_b{b}_step_ms"] = g["step_median_ms"]
            ours[f"{tag}_b{b}_tokens_per_s"] = g["step_tokens_per_s"]
            # Steady state: the median step (the mean includes the warm-up runs and the
            # CUDA graph's capture, which 63 steps do not amortize).
            ours[f"{tag}_b{b}_median_tokens_per_s"] = b / g["step_median_ms"] * 1e3
            ours[f"{tag}_b{b}_note"] = g.get("note")
            ours[f"{tag}_b{b}_in_place"] = g.get("state_in_place")
        except Exception as e:
            ours[f"{tag}_b{b}_error"] = str(e)
for tag in ["static17", "static24"]:
    try:
        runs = j(f"compare-{tag}.json")
        toks = {r["runtime"]: r["tokens"] for r in runs}
        first = next(iter(toks.values()))
        ours[f"check_tokens_{tag}"] = "equal in " + ", ".join(toks) if all(t == first for t in toks.values()) else f"DIFFER {toks}"
    except Exception as e:
        ours[f"check_tokens_{tag}"] = f"error {e}"
try:
    rc = dict(l.split() for l in open(os.path.join(d, "exit_codes.txt")))
    msg = open(os.path.join(d, "device99.txt")).read().strip()
    ours["check_device_99"] = f"exit {rc.get('device-99')}: {msg}"
    dev0 = j("device0-static17.json")[0]
    cmp17 = {r["runtime"]: r["tokens"] for r in j("compare-static17.json")}
    same = all(t == dev0["tokens"] for t in cmp17.values())
    ours["check_device_0"] = ("tokens equal to the compare run" if same else "DIFFER") + f"; note: {dev0.get('note')}"
except Exception as e:
    ours["check_device"] = f"error {e}"
worst, bad = 0.0, []
for f in sorted(glob.glob(os.path.join(d, "json", "fixture-*.json"))):
    name = os.path.basename(f)[len("fixture-"):-len(".json")]
    r = json.load(open(f))
    if name.endswith("-greedy"):
        base = name[: -len("-greedy")]
        got = r[0]["tokens"]
        want = fixtures[base]["greedy_tokens"]
        ours[f"check_greedy_{base}"] = "equal to upstream" if got == want else f"DIFFER {got} vs {want}"
        continue
    if not r.get("pass", False):
        bad.append(name)
    for path, val in find(r, lambda p, o: isinstance(o, float) and p.endswith("max_rel")):
        worst = max(worst, val)
ours["check_fixtures"] = f"{len(glob.glob(os.path.join(d, 'json', 'fixture-*.json')))} reports, worst max_rel {worst:.2e}, failing: {bad or 'none'}"
print(json.dumps(ours, indent=1))
PY
python3 "$here/gpu_decode.py" summary "$out"
echo "exit codes:"; cat "$out/exit_codes.txt"
