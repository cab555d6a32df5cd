#!/usr/bin/env bash
# Writes a fixed set of Triton model repositories and prints, per case, the exit status and
# message of `gmlp-onnx triton` (temporary paths replaced by OUT), then every directory and
# the SHA-256 of every file of every repository, so that two versions of gmlp-onnx can be
# compared byte for byte (a refactoring must not change any output). Covers stateless
# token and vision models, with-past models in each precision (the token-shift fixture
# with its window state), external data (renamed to model.onnx.data, and kept when already
# so named), every `--triton-*` option, a second version beside an identical config.pbtxt,
# `build --triton-repo`, and the refusals (bad options, a different config, a non-empty
# version, a model that already carries the state adapter or the position counter).
#
# Usage: scripts/triton_hashes.sh [BINARY] > triton.txt   (default: target/debug/gmlp-onnx)
# Compare: diff <(scripts/triton_hashes.sh old/gmlp-onnx) <(scripts/triton_hashes.sh new/gmlp-onnx)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/debug/gmlp-onnx}"
[ -x "$bin" ] || { echo "triton_hashes: $bin is not an executable (cargo build first)" >&2; exit 2; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
models="$out/models"
repos="$out/repos"
mkdir -p "$models/kept" "$repos"

build() { # NAME ARGS...
  local name="$1"; shift
  "$bin" build -q "$@" -o "$models/$name.onnx" >/dev/null
}

build tokens --preset amlp-base --layers 2
build vision --preset gmlp-ti16 --layers 2
build tokens-ext --preset amlp-base --layers 2 --external-data
# The help texts, read whole: `"$bin" build --help | grep -q` would race (grep exits at the
# first match, the binary then dies of SIGPIPE, and pipefail turns the match into a failure).
build_help="$("$bin" build --help)"
triton_help="$("$bin" triton --help)"
# The growing form is `--with-past growing` in versions that have the static form.
past=(--with-past)
grep -q -- 'growing' <<<"$build_help" && past=(--with-past growing)
build past --preset amlp-base --layers 2 --causal "${past[@]}"
build past-f16 --preset gmlp-base --layers 2 --causal "${past[@]}" --dtype f16
build past-int8 --preset amlp-base --layers 2 --causal "${past[@]}" --dtype int8
build past-ext --preset amlp-base --layers 2 --causal "${past[@]}" --external-data
build past-lucid --weights fixtures/lucid_amlp_causal/model.safetensors --causal "${past[@]}"
build past-shift --weights fixtures/lucid_shift_causal/model.safetensors --causal \
  --shift-tokens 2 "${past[@]}"
# Static state (docs/static-state.md; versions that have it): batched; behind the position
# counter in versions that have it.
static_form=0
grep -q -- 'growing' <<<"$build_help" && static_form=1
if [ "$static_form" = 1 ]; then
  build static --preset amlp-base --layers 2 --causal --with-past static
  build static-shift --weights fixtures/lucid_shift_causal/model.safetensors --causal \
    --shift-tokens 2 --with-past static
fi
# External data already named model.onnx.data: copied as it is, the model unchanged.
"$bin" build -q --preset amlp-base --layers 2 --external-data -o "$models/kept/model.onnx" >/dev/null

triton() { # CASE MODEL REPO ARGS...
  local case="$1" model="$2" repo="$3"; shift 3
  local rc=0
  "$bin" triton "$models/$model" --repo "$repos/$repo" "$@" >"$out/message" 2>&1 || rc=$?
  echo "$case: exit $rc: $(sed "s#$out#OUT#g" "$out/message" | tr '\n' ' ')"
}

triton tokens tokens.onnx a
triton tokens-version-2 tokens.onnx a --triton-version 2
triton tokens-other-config tokens.onnx a --triton-version 3 --triton-max-batch-size 4
triton tokens-version-taken tokens.onnx a
triton tokens-all-options tokens.onnx b --triton-name lm.v1 --triton-version 7 \
  --triton-max-batch-size 4 --triton-kind gpu --triton-instances 3 --triton-tensorrt fp16 \
  --triton-max-queue-delay-us 2500
triton tokens-fp32-trt tokens.onnx b --triton-name trt32 --triton-kind gpu --triton-tensorrt fp32
triton tokens-cpu-2 tokens.onnx b --triton-name cpu2 --triton-instances 2 --triton-kind cpu
triton vision vision.onnx a
triton vision-unbatched vision.onnx a --triton-name vision0 --triton-max-batch-size 0
triton tokens-ext tokens-ext.onnx a
triton kept kept/model.onnx a --triton-name kept
triton past past.onnx c
triton past-batch-1 past.onnx c --triton-name past1 --triton-max-batch-size 1
triton past-gpu past.onnx c --triton-name pastgpu --triton-kind gpu --triton-instances 2
triton past-f16 past-f16.onnx c
triton past-int8 past-int8.onnx c
triton past-ext past-ext.onnx c
triton past-lucid past-lucid.onnx c
triton past-shift past-shift.onnx c
if [ "$static_form" = 1 ]; then
  triton static static.onnx e
  triton static-batch-16 static.onnx e --triton-name static16 --triton-max-batch-size 16 \
    --triton-max-queue-delay-us 500
  triton static-shift static-shift.onnx e
  triton static-batch-0 static.onnx f --triton-max-batch-size 0
fi
# The idle time of a with-past model's sequences (versions that have the flag).
idle_flag=0
grep -q -- '--triton-max-sequence-idle-us' <<<"$triton_help" && idle_flag=1
if [ "$idle_flag" = 1 ]; then
  triton static-idle static.onnx e --triton-name static-idle --triton-max-sequence-idle-us 2000000
  triton past-idle past.onnx c --triton-name past-idle --triton-max-sequence-idle-us 5000000
fi
# Refusals: nothing may be written.
triton past-batch-8 past.onnx d --triton-max-batch-size 8
triton past-batch-0 past.onnx d --triton-max-batch-size 0
triton adapted-again ../repos/c/past/1/model.onnx d --triton-name again
if [ "$static_form" = 1 ]; then
  triton static-adapted-again ../repos/e/static/1/model.onnx d --triton-name again-static
fi
if [ "$idle_flag" = 1 ]; then
  triton idle-stateless tokens.onnx d --triton-max-sequence-idle-us 1000000
  triton idle-0 past.onnx d --triton-name idle0 --triton-max-sequence-idle-us 0
fi
triton version-0 tokens.onnx d --triton-version 0
triton instances-0 tokens.onnx d --triton-instances 0
triton trt-on-cpu tokens.onnx d --triton-tensorrt fp16
triton hidden-name tokens.onnx d --triton-name .hidden
triton slash-name tokens.onnx d --triton-name a/b
triton dash-name tokens.onnx d --triton-name=-x
touch "$repos/file"
triton repo-is-a-file tokens.onnx file
# build --triton-repo writes the same entry as build then triton.
rc=0
"$bin" build -q --preset amlp-base --layers 2 --causal "${past[@]}" -o "$models/built.onnx" \
  --triton-repo "$repos/e" --triton-name built --triton-version 2 >/dev/null 2>&1 || rc=$?
echo "build-triton-repo: exit $rc"

# Directories too: a refused case leaves none behind.
(cd "$repos" && find . -type d | LC_ALL=C sort && find . -type f | LC_ALL=C sort | xargs sha256sum)
