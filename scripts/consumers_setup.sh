#!/usr/bin/env bash
# Installs the downstream consumers that tests/external/consumers.rs runs our files in, each from its
# registry, into ~/.cache/gmlp-onnx/<name>-<key> (key: a hash of what is installed, so a
# changed pin installs afresh and an unchanged one is reused). Idempotent; a warm rerun takes
# about a second. Prints `export NAME=VALUE` lines for scripts/test to eval; progress goes to
# stderr.
#
#   openvino, opencv4, opencv5   Python venvs (PyPI wheels, Debian's python3)
#   ort-node, ort-node-legacy    onnxruntime-node from npm, installed with --ignore-scripts
#                                (the CPU library ships in the package; 1.14.0 is the old
#                                ONNX Runtime: PyPI's onnxruntime 1.14.1 has no wheel for
#                                Python 3.11, npm's carries libonnxruntime.so.1.14.0)
#   ort-web                      onnxruntime-web and puppeteer-core from npm (--ignore-scripts:
#                                puppeteer-core downloads no browser; tests drive Debian's
#                                chromium, which .ci/run installs with apt)
#   candle                       tests/consumers/candle built with cargo (needs protoc)
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${GMLP_ONNX_CACHE:-$HOME/.cache/gmlp-onnx}"
mkdir -p "$cache"
# One installer at a time per cache (parallel scripts/test runs on one machine wait here).
exec 9>"$cache/consumers_setup.lock"
flock 9
numpy_pin="numpy==2.4.6"

key_of() { printf '%s' "$*" | sha256sum | cut -c1-12; }
log() { echo "consumers_setup: $*" >&2; }
seconds() { date +%s; }

# Atomic per-component install: build in DIR.tmp, rename to DIR when complete.
python_venv() { # NAME PACKAGES...
  local name=$1; shift
  local dir="$cache/$name-$(key_of "$(python3 --version)" "$numpy_pin" "$@")"
  if [ ! -e "$dir/.complete" ]; then
    local t0; t0=$(seconds)
    log "installing $name ($*) into $dir"
    rm -rf "$dir.tmp" "$dir"
    python3 -m venv "$dir.tmp"
    "$dir.tmp/bin/python" -m pip install --quiet --disable-pip-version-check "$numpy_pin" "$@" >&2
    # The venv's scripts name their own path; a rename keeps them working because every
    # runner is started as DIR/bin/python (absolute), never through bin/ entry points.
    mv "$dir.tmp" "$dir"
    touch "$dir/.complete"
    log "$name installed in $(( $(seconds) - t0 )) s"
  fi
  echo "$dir/bin/python"
}

npm_package() { # NAME SPEC...
  local name=$1; shift
  local dir="$cache/$name-$(key_of "$(node --version)" "$@")"
  if [ ! -e "$dir/.complete" ]; then
    local t0; t0=$(seconds)
    log "installing $* (npm, --ignore-scripts) into $dir"
    rm -rf "$dir.tmp" "$dir"
    mkdir -p "$dir.tmp"
    npm install --silent --no-audit --no-fund --ignore-scripts --prefix "$dir.tmp" "$@" >&2
    mv "$dir.tmp" "$dir"
    touch "$dir/.complete"
    log "$name installed in $(( $(seconds) - t0 )) s"
  fi
  echo "$dir/node_modules"
}

candle_program() {
  local src=tests/consumers/candle
  local key
  key=$(key_of "$(rustc --version)" "$(cat "$src/Cargo.toml" "$src/Cargo.lock" "$src/src/main.rs")")
  local dir="$cache/candle-$key"
  if [ ! -e "$dir/candle-consumer" ]; then
    command -v protoc >/dev/null || { log "protoc missing (apt-get install protobuf-compiler)"; exit 1; }
    local t0; t0=$(seconds)
    # One target dir for every key: an edit to main.rs rebuilds only the program.
    log "building candle-onnx consumer (cargo, target dir $cache/candle-target)"
    CARGO_TARGET_DIR="$cache/candle-target" cargo build --quiet --locked \
      --manifest-path "$src/Cargo.toml" >&2
    mkdir -p "$dir"
    cp "$cache/candle-target/debug/candle-consumer" "$dir/candle-consumer.tmp"
    mv "$dir/candle-consumer.tmp" "$dir/candle-consumer"
    log "candle consumer built in $(( $(seconds) - t0 )) s"
  fi
  echo "$dir/candle-consumer"
}

echo "export GMLP_CONSUMER_OPENVINO=$(python_venv openvino openvino==2026.4.1)"
echo "export GMLP_CONSUMER_OPENCV4=$(python_venv opencv4 opencv-python-headless==4.14.0.94)"
echo "export GMLP_CONSUMER_OPENCV5=$(python_venv opencv5 opencv-python-headless==5.0.0.93)"
echo "export GMLP_CONSUMER_ORT_NODE=$(npm_package ort-node onnxruntime-node@1.30.0)"
echo "export GMLP_CONSUMER_ORT_NODE_LEGACY=$(npm_package ort-node-legacy onnxruntime-node@1.14.0)"
command -v "${GMLP_CHROMIUM:-chromium}" >/dev/null || { log "chromium missing (apt-get install chromium)"; exit 1; }
echo "export GMLP_CONSUMER_ORT_WEB=$(npm_package ort-web onnxruntime-web@1.30.0 puppeteer-core@24.43.1)"
echo "export GMLP_CONSUMER_CANDLE=$(candle_program)"
