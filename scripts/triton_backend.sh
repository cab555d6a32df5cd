#!/usr/bin/env bash
# Sets up a real Triton Inference Server for the tests and benchmarks, idempotently:
#   - a Python venv with scripts/requirements-triton.txt (nvidia-pytriton ships the
#     `tritonserver` 2.51.0 binary and libtritonserver; tritonclient talks HTTP to it);
#   - Triton's ONNX Runtime backend (r24.10), built from the vendored sources in
#     ../shared/vendor against that venv's PyPI libonnxruntime.so (API 31 ≥ the headers' 29).
# Everything lands in ~/.cache/gmlp-onnx/triton-<key> (override the root with
# GMLP_ONNX_CACHE), where <key> hashes the vendored sources, the requirements and this
# script: a rerun on the same machine costs well under a second, a fresh machine builds
# (~1-2 min on 2 cores, plus the pip download).
#
# Needs: cmake, a C++17 compiler, rapidjson-dev and googletest (Debian packages; .ci/run
# installs them). Prints `NAME=VALUE` lines on stdout for scripts/test to export:
#   GMLP_ONNX_TRITON_PYTHON      the venv's python (tritonclient, numpy, onnxruntime)
#   GMLP_ONNX_TRITONSERVER       the tritonserver binary
#   GMLP_ONNX_TRITON_BACKENDS    the --backend-directory holding onnxruntime/
#   GMLP_ONNX_TRITON_LIBS        the LD_LIBRARY_PATH tritonserver needs (the wheel's libs)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
vendor="${GMLP_ONNX_VENDOR:-$root/../shared/vendor}"
if [ ! -d "$vendor/triton-r24.10/onnxruntime_backend" ] || [ ! -f "$vendor/onnxruntime-c-api-29/onnxruntime_c_api.h" ]; then
  echo "triton_backend.sh: vendored sources not found in $vendor (set GMLP_ONNX_VENDOR)" >&2
  exit 2
fi
vendor="$(cd "$vendor" && pwd)"
for tool in cmake c++ python3; do
  command -v "$tool" >/dev/null || { echo "triton_backend.sh: $tool is missing (apt-get install cmake g++ rapidjson-dev googletest)" >&2; exit 2; }
done
[ -d /usr/src/googletest ] || { echo "triton_backend.sh: /usr/src/googletest is missing (apt-get install googletest)" >&2; exit 2; }
[ -f /usr/include/rapidjson/document.h ] || { echo "triton_backend.sh: rapidjson headers are missing (apt-get install rapidjson-dev)" >&2; exit 2; }

key="$( { (cd "$vendor" && find triton-r24.10 onnxruntime-c-api-29 -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum);
          sha256sum < "$root/scripts/requirements-triton.txt"; sha256sum < "$0"; python3 --version; } | sha256sum | cut -c1-16)"
cache_root="${GMLP_ONNX_CACHE:-$HOME/.cache/gmlp-onnx}"
home="$cache_root/triton-$key"

emit() {
  local sp
  sp="$("$home/venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  echo "GMLP_ONNX_TRITON_PYTHON=$home/venv/bin/python"
  echo "GMLP_ONNX_TRITONSERVER=$sp/pytriton/tritonserver/bin/tritonserver"
  echo "GMLP_ONNX_TRITON_BACKENDS=$home/backends"
  echo "GMLP_ONNX_TRITON_LIBS=$sp/nvidia_pytriton.libs"
}

if [ -f "$home/done" ]; then emit; exit 0; fi

mkdir -p "$cache_root"
exec 9>"$cache_root/triton-$key.lock"
flock 9
if [ -f "$home/done" ]; then emit; exit 0; fi
start=$(date +%s)
rm -rf "$home" && mkdir -p "$home"
log="$home/build.log"
echo "triton_backend.sh: setting up Triton in $home (log: $log)" >&2

python3 -m venv "$home/venv"
"$home/venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/scripts/requirements-triton.txt" >>"$log" 2>&1 \
  || { tail -20 "$log" >&2; exit 1; }
sp="$("$home/venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')"

ortlib="$home/ortlib"
mkdir -p "$ortlib"
lib="$(ls "$sp"/onnxruntime/capi/libonnxruntime.so.1.* | head -1)"
cp "$lib" "$ortlib/"
(cd "$ortlib" && ln -sf "$(basename "$lib")" libonnxruntime.so.1 && ln -sf libonnxruntime.so.1 libonnxruntime.so)

t="$vendor/triton-r24.10"
build="$home/be-build"
cmake -S "$t/onnxruntime_backend" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTRITON_ENABLE_GPU=OFF \
  -DTRITON_ONNXRUNTIME_INCLUDE_PATHS="$vendor/onnxruntime-c-api-29" -DTRITON_ONNXRUNTIME_LIB_PATHS="$ortlib" \
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=/usr/src/googletest \
  -DFETCHCONTENT_SOURCE_DIR_REPO-COMMON="$t/common" \
  -DFETCHCONTENT_SOURCE_DIR_REPO-CORE="$t/core" \
  -DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND="$t/backend" >>"$log" 2>&1 || { tail -30 "$log" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" --target triton-onnxruntime-backend >>"$log" 2>&1 || { tail -30 "$log" >&2; exit 1; }

be="$home/backends/onnxruntime"
mkdir -p "$be"
cp -P "$build/libtriton_onnxruntime.so" "$ortlib"/* "$be/"
# The wheel ships libtritonserver under a hashed name; the backend links libtritonserver.so.
ln -sf "$(ls "$sp"/nvidia_pytriton.libs/libtritonserver-*.so | head -1)" "$be/libtritonserver.so"
rm -rf "$build"
echo "triton_backend.sh: ready in $(( $(date +%s) - start )) s" >&2
touch "$home/done"
emit
