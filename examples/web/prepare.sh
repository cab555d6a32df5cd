#!/usr/bin/env bash
# Prepares a folder that serves the examples/web page: the page's files, ONNX Runtime
# Web's WebAssembly build and its WebGPU build (three files of onnxruntime-web's dist/
# each, into ort/: the page loads the WebGPU one where the browser offers WebGPU) and the
# model (as model.onnx). Serve the folder with any static server, e.g.
#   python3 -m http.server 8000 --bind 127.0.0.1 --directory OUT_DIR
# and open http://127.0.0.1:8000/. See docs/web.md.
#
# Usage: examples/web/prepare.sh OUT_DIR MODEL.onnx [NODE_MODULES]
#   NODE_MODULES: a node_modules folder holding onnxruntime-web; without it the pinned
#   version is installed from npm into a temporary folder.
set -euo pipefail
ORT_WEB="onnxruntime-web@1.30.0"
FILES=(ort.wasm.min.mjs ort-wasm-simd-threaded.mjs ort-wasm-simd-threaded.wasm
  ort.webgpu.min.mjs ort-wasm-simd-threaded.asyncify.mjs ort-wasm-simd-threaded.asyncify.wasm)

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 OUT_DIR MODEL.onnx [NODE_MODULES]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
out=$1 model=$2 modules=${3:-}
[ -f "$model" ] || { echo "prepare.sh: $model: no such file" >&2; exit 2; }
if [ -e "$model.data" ]; then
  echo "prepare.sh: $model has external data; the page loads single-file models" >&2
  exit 2
fi

tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT
if [ -z "$modules" ]; then
  tmp="$(mktemp -d)"
  echo "prepare.sh: installing $ORT_WEB from npm into $tmp" >&2
  npm install --silent --no-audit --no-fund --ignore-scripts --prefix "$tmp" "$ORT_WEB" >&2
  modules="$tmp/node_modules"
fi
dist="$modules/onnxruntime-web/dist"
for f in "${FILES[@]}"; do
  [ -f "$dist/$f" ] || { echo "prepare.sh: $dist/$f missing (is onnxruntime-web installed there?)" >&2; exit 2; }
done

mkdir -p "$out/ort"
cp "$here/index.html" "$here/app.js" "$here/gmlp.js" "$out/"
for f in "${FILES[@]}"; do cp "$dist/$f" "$out/ort/"; done
cp "$model" "$out/model.onnx"
echo "prepare.sh: $out is ready; serve it, e.g. python3 -m http.server 8000 --bind 127.0.0.1 --directory $out" >&2
