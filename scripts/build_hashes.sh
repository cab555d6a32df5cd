#!/usr/bin/env bash
# Builds a fixed set of models and prints the SHA-256 of every file written, one line per
# file ("<hash>  <name>"), so that two versions of gmlp-onnx can be compared byte for byte
# (a refactoring must not change any output). Covers every preset at --layers 2 (both
# Toeplitz forms for one), an import of each fixture (each flag the fixture needs, bf16/f16
# checkpoints, --save-weights), f16, opsets 13, 18 and 21, --target profiles, external data,
# with-past and static state, int8, int4 and int8-weight-only.
#
# Usage: scripts/build_hashes.sh [BINARY] > hashes.txt   (default: target/release/gmlp-onnx)
# Compare: diff <(scripts/build_hashes.sh old/gmlp-onnx) <(scripts/build_hashes.sh new/gmlp-onnx)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/gmlp-onnx}"
[ -x "$bin" ] || { echo "build_hashes: $bin is not an executable (cargo build --release first)" >&2; exit 2; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

build() { # NAME ARGS...
  local name="$1"; shift
  "$bin" build -q "$@" -o "$out/$name.onnx" >/dev/null
}

for preset in gmlp-ti16 gmlp-s16 gmlp-b16 gmlp-base amlp-base gmlp-large amlp-large gmlp-xlarge; do
  build "$preset" --preset "$preset" --layers 2
done
build amlp-base-expand --preset amlp-base --layers 2 --spatial toeplitz-expand --init spread
build amlp-base-dense --preset amlp-base --layers 1 --seq-len 64 --spatial dense --causal
build amlp-base-f16 --preset amlp-base --layers 2 --dtype f16 --seed 7
build gmlp-ti16-f16-opset21 --preset gmlp-ti16 --layers 2 --dtype f16 --opset 21
build amlp-base-opset18 --preset amlp-base --layers 2 --opset 18 --causal
build amlp-base-external --preset amlp-base --layers 2 --external-data
# The help text, read whole: `"$bin" build --help | grep -q` would race (grep exits at the
# first match, the binary then dies of SIGPIPE, and pipefail turns the match into a failure).
help="$("$bin" build --help)"
# Opsets below 17 and the --target profiles (skipped by versions without them).
if grep -q -- '--target' <<<"$help"; then
  build gmlp-ti16-opset13 --preset gmlp-ti16 --layers 2 --opset 13
  for target in ort-legacy portable opencv4 candle; do
    build "amlp-base-$target" --preset amlp-base --layers 2 --causal --target "$target"
    build "gmlp-ti16-$target" --preset gmlp-ti16 --layers 2 --target "$target"
  done
fi
# The tract target (versions with it), whose static step differs from the default file's
# (the onnxruntime target's files are among the static-state ones below, as ort-gpu).
targets_help="$(sed -n '/--target <TARGET>/,/^      --[a-z]/p' <<<"$help")"
if grep -q -- "- tract:" <<<"$targets_help"; then
  build amlp-base-tract-static --preset amlp-base --layers 2 --causal --with-past static --target tract
  build amlp-base-tract-any-length --preset amlp-base --layers 2 --causal --target tract
  build gmlp-ti16-tract --preset gmlp-ti16 --layers 2 --target tract
fi

for dir in fixtures/*/; do
  name="$(basename "$dir")"
  # Imports only (fixtures/pytorch holds .pt files for the pickle reader's tests).
  [ -f "${dir}meta.json" ] || continue
  # The flags the weights cannot show, as the fixture's meta.json records them.
  read -r -a flags <<<"$(python3 - "${dir}meta.json" <<'PY'
import json, sys
flags = json.load(open(sys.argv[1]))["flags"]
words = []
for key, value in flags.items():
    option = "--" + key.replace("_", "-")
    words += [option] if value is True else [option, str(value)]
print(" ".join(words))
PY
)"
  for ck in "$dir"model*.safetensors; do
    tag="$name-$(basename "$ck" .safetensors)"
    build "$tag" --weights "$ck" "${flags[@]}"
  done
  build "$name-f16" --weights "${dir}model.safetensors" "${flags[@]}" --dtype f16 \
    --save-weights "$out/$name-native.safetensors"
done
build lucid_tokens-gather --weights fixtures/lucid_tokens_causal/model.safetensors --causal \
  --spatial toeplitz-gather --toeplitz-tol 1
# --with-past graphs (skipped by versions without it): presets in each precision, a
# target, and the causal fixtures (the token-shift one has a window state).
# The growing form is `--with-past growing` in versions that have the static form (whose
# help names it), and a plain `--with-past` before.
static_form=0
grep -q -- 'growing' <<<"$help" && static_form=1
if grep -q -- '--with-past' <<<"$help"; then
  past=(--with-past)
  [ "$static_form" = 1 ] && past=(--with-past growing)
  build amlp-base-with-past --preset amlp-base --layers 2 --causal "${past[@]}"
  build amlp-base-with-past-int8 --preset amlp-base --layers 2 --causal "${past[@]}" --dtype int8
  build gmlp-base-with-past-f16 --preset gmlp-base --layers 2 --causal "${past[@]}" --dtype f16
  build amlp-base-with-past-portable --preset amlp-base --layers 2 --causal "${past[@]}" \
    --target portable
  build lucid_amlp_causal-with-past --weights fixtures/lucid_amlp_causal/model.safetensors \
    --causal "${past[@]}"
  # Refused before the token-shift window state existed.
  build lucid_shift_causal-with-past --weights fixtures/lucid_shift_causal/model.safetensors \
    --causal --shift-tokens 2 "${past[@]}" 2>/dev/null || echo "(refused)" >"$out/lucid_shift_causal-with-past.onnx"
fi
# Static state (docs/static-state.md; skipped by versions without it): ScatterND at the
# default opset, TensorScatter at 24, each precision, a target, the token-shift fixture,
# and the ort-gpu profile's step.
if [ "$static_form" = 1 ]; then
  build amlp-base-static --preset amlp-base --layers 2 --causal --with-past static
  build amlp-base-static-opset24 --preset amlp-base --layers 2 --causal --with-past static --opset 24
  build amlp-base-static-int8 --preset amlp-base --layers 2 --causal --with-past static --dtype int8
  build gmlp-base-static-f16 --preset gmlp-base --layers 2 --causal --with-past static --dtype f16
  build amlp-base-static-portable --preset amlp-base --layers 2 --causal --with-past static \
    --target portable
  build lucid_shift_causal-static --weights fixtures/lucid_shift_causal/model.safetensors \
    --causal --shift-tokens 2 --with-past static
  # The ort-gpu profile's static step (fused from 0.6.0 on): f32, int4, a gMLP.
  if grep -q -- 'ort-gpu' <<<"$help"; then
    build amlp-base-static-ort-gpu --preset amlp-base --layers 2 --causal --with-past static \
      --target ort-gpu
    build amlp-base-static-ort-gpu-int4 --preset amlp-base --layers 2 --causal --with-past static \
      --target ort-gpu --dtype int4
    build gmlp-base-static-ort-gpu --preset gmlp-base --layers 2 --causal --with-past static \
      --target ort-gpu
  fi
fi
# Weight-only types (skipped by versions without them): every form of file they make.
if grep -q -- 'int8-weight-only' <<<"$help"; then
  for dtype in int4 int8-weight-only; do
    build "amlp-base-$dtype" --preset amlp-base --layers 2 --causal --dtype "$dtype"
    build "amlp-base-$dtype-fixed" --preset amlp-base --layers 2 --dtype "$dtype"
    build "gmlp-ti16-$dtype" --preset gmlp-ti16 --layers 2 --dtype "$dtype"
    build "amlp-base-with-past-$dtype" --preset amlp-base --layers 2 --causal "${past[@]}" \
      --dtype "$dtype"
    build "amlp-base-static-$dtype" --preset amlp-base --layers 2 --causal --with-past static \
      --dtype "$dtype"
    build "gpt_reversible-$dtype" --weights fixtures/gpt_reversible/model.safetensors \
      --dtype "$dtype"
  done
fi

(cd "$out" && sha256sum -- * | sort -k2)
