"""The consumer matrix (docs/model.md, "Where the files run"): builds every model of
matrix.toml with gmlp-onnx, runs it in every downstream consumer, compares each output with
ONNX Runtime 1.31 (Python), writes results.json and compatibility.md, and checks every cell
against matrix.toml's expectations.

Usage: python matrix.py --gmlp BIN --out DIR [--update-docs | --models A,B --consumers C,D]
Run by tests/external/consumers.rs; the consumers come from scripts/consumers_setup.sh, whose
`GMLP_CONSUMER_*` variables scripts/test exports. Exits 1 when a cell's pass/fail status
differs from the expectation (or a consumer is not installed), 0 otherwise.
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
import tomllib

import numpy as np
import onnx

from consumer_runs import CLOSE_AT_EXIT, BrowserConsumer, node_consumer, run_command  # beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PY_RUNNER = os.path.join(HERE, "runners", "python_consumer.py")
TOL_F32 = 1e-5
TOL_F16 = 1e-2
# int8 files: consumers run DynamicQuantizeLinear/MatMulInteger with their own rounding of
# the activations (the int8 tolerance of src/validate/tolerance.rs).
TOL_INT8 = 1e-1


def env(name):
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"matrix.py: {name} is not set: run through scripts/test "
                         "(it evals scripts/consumers_setup.sh)")
    return value


def lock_version(lock_path, crate):
    """The version of `crate` in a Cargo.lock."""
    text = open(lock_path, encoding="utf-8").read()
    match = re.search(r'name = "%s"\nversion = "([^"]+)"' % re.escape(crate), text)
    return match.group(1) if match else "?"


# --- consumers --------------------------------------------------------------------------------

class Consumer:
    """One downstream stack: how to run a file in it and which version it is."""

    def __init__(self, key, label, run, version, prepare=None, note="", detail=None):
        self.key, self.label, self.run, self.version_fn = key, label, run, version
        self.prepare = prepare
        self.note = note
        # What the consumer said of its last run beyond the outputs ({} if nothing).
        self.detail = detail or (lambda: {})
        self._version = None

    def version(self):
        if self._version is None:
            try:
                self._version = self.version_fn()
            except Exception as exc:  # a broken install shows up in the table, not as a crash
                self._version = f"? ({exc})"
        return self._version


def python_consumer(python, kind):
    def run(model, inputs, outputs):
        return run_command([python, PY_RUNNER, kind, model, inputs, outputs])

    def version():
        return subprocess.run([python, PY_RUNNER, kind, "--version"], capture_output=True,
                              text=True, check=True).stdout.strip()

    return run, version


def validate_consumer(gmlp, runtime):
    def run(model, inputs, outputs):
        return run_command([gmlp, "validate", model, "--runtimes", runtime, "--inputs", inputs,
                            "--save-outputs", outputs])

    return run


def rewrite_ir(version):
    """A preparation step: the same file with its ir_version set to `version` (nothing else)."""
    def prepare(model):
        proto = onnx.load(model)
        proto.ir_version = version
        path = model[: -len(".onnx")] + f".ir{version}.onnx"
        onnx.save(proto, path)
        return path

    return prepare


def decompose_layernorm(model):
    """A preparation step: every LayerNormalization (last axis) replaced by the textbook
    ReduceMean/Sub/Mul/Sqrt/Div/Add form, nothing else changed. ReduceMean takes `axes` as an
    attribute below opset 18 and as an input from 18 (both forms are written as the file's
    opset requires)."""
    from onnx import helper, numpy_helper

    proto = onnx.load(model)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    graph = proto.graph
    nodes = []
    extra = []
    if opset >= 18:
        extra.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "ln_decomposed.axes"))
    for node in graph.node:
        if node.op_type != "LayerNormalization":
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("axis", -1) != -1:
            raise ValueError(f"{node.name}: LayerNormalization over axis {attrs['axis']}")
        eps_name = f"{node.name}/ln_decomposed.eps"
        extra.append(numpy_helper.from_array(np.array(attrs.get("epsilon", 1e-5), dtype=np.float32), eps_name))
        x, scale, bias = node.input[0], node.input[1], node.input[2]
        p = node.name + "/ln_decomposed."

        def mean(inp, out):
            if opset >= 18:
                return helper.make_node("ReduceMean", [inp, "ln_decomposed.axes"], [out], keepdims=1)
            return helper.make_node("ReduceMean", [inp], [out], axes=[-1], keepdims=1)

        nodes += [
            mean(x, p + "mean"),
            helper.make_node("Sub", [x, p + "mean"], [p + "centered"]),
            helper.make_node("Mul", [p + "centered", p + "centered"], [p + "squared"]),
            mean(p + "squared", p + "var"),
            helper.make_node("Add", [p + "var", eps_name], [p + "var_eps"]),
            helper.make_node("Sqrt", [p + "var_eps"], [p + "std"]),
            helper.make_node("Div", [p + "centered", p + "std"], [p + "normalized"]),
            helper.make_node("Mul", [p + "normalized", scale], [p + "scaled"]),
            helper.make_node("Add", [p + "scaled", bias], [node.output[0]]),
        ]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(extra)
    path = model[: -len(".onnx")] + ".ln-decomposed.onnx"
    onnx.save(proto, path)
    return path


def consumers(gmlp, out_dir):
    ref_py = sys.executable
    ort_run, ort_version = python_consumer(ref_py, "onnxruntime")
    ref_run, ref_version = python_consumer(ref_py, "onnx-reference")
    ov_run, ov_version = python_consumer(env("GMLP_CONSUMER_OPENVINO"), "openvino")
    cv4_run, cv4_version = python_consumer(env("GMLP_CONSUMER_OPENCV4"), "opencv")
    cv5_run, cv5_version = python_consumer(env("GMLP_CONSUMER_OPENCV5"), "opencv")
    cv5c_run, _ = python_consumer(env("GMLP_CONSUMER_OPENCV5"), "opencv-classic")
    node_run, node_version = node_consumer(env("GMLP_CONSUMER_ORT_NODE"))
    legacy_run, legacy_version = node_consumer(env("GMLP_CONSUMER_ORT_NODE_LEGACY"))
    web = BrowserConsumer(env("GMLP_CONSUMER_ORT_WEB"), os.path.join(out_dir, "ort_web.log"))
    webgpu = BrowserConsumer(env("GMLP_CONSUMER_ORT_WEB"), os.path.join(out_dir, "ort_webgpu.log"),
                             ep="webgpu")
    candle = env("GMLP_CONSUMER_CANDLE")
    main_lock = os.path.join(ROOT, "Cargo.lock")
    candle_lock = os.path.join(HERE, "candle", "Cargo.lock")
    return [
        Consumer("onnxruntime-python", "ONNX Runtime (Python)", ort_run, ort_version,
                 note="the reference every other cell is compared with"),
        Consumer("onnxruntime-rust", "ONNX Runtime (Rust `ort`, `validate --runtimes ort-cpu`)",
                 validate_consumer(gmlp, "ort-cpu"),
                 lambda: f"{ort_version()} (ort {lock_version(main_lock, 'ort')})"),
        Consumer("tract", "tract (`validate --runtimes tract`)", validate_consumer(gmlp, "tract"),
                 lambda: lock_version(main_lock, "tract-onnx")),
        Consumer("onnx-reference", "onnx.reference (ReferenceEvaluator)", ref_run, ref_version),
        Consumer("openvino", "OpenVINO (CPU, INFERENCE_PRECISION_HINT f32)", ov_run, ov_version),
        Consumer("onnxruntime-node", "onnxruntime-node (npm)", node_run, node_version),
        Consumer("onnxruntime-web", "onnxruntime-web (npm; WASM, 1 thread) in headless Chromium",
                 web.run, web.version,
                 note="Debian's Chromium driven by puppeteer-core; the page loads the file over HTTP from 127.0.0.1"),
        Consumer("onnxruntime-web-webgpu",
                 "onnxruntime-web (npm; WebGPU EP, SwiftShader adapter) in headless Chromium",
                 webgpu.run, lambda: webgpu.version() + ", WebGPU: SwiftShader",
                 note="Chromium with --enable-unsafe-webgpu: its adapter is SwiftShader's (on the CPU, no "
                      "shader-f16); each cell also gives how many nodes ONNX Runtime placed on its CPU "
                      "provider (its verbose log), of all the session's nodes",
                 detail=lambda: webgpu.last_detail),
        Consumer("onnxruntime-1.14", "ONNX Runtime 1.14 (onnxruntime-node 1.14 from npm)",
                 legacy_run, legacy_version),
        Consumer("onnxruntime-1.14-ir8", "ONNX Runtime 1.14, same file rewritten to IR 8 by the test",
                 legacy_run, legacy_version, prepare=rewrite_ir(8)),
        Consumer("opencv4", "OpenCV 4 dnn (opencv-python-headless)", cv4_run, cv4_version),
        Consumer("opencv5", "OpenCV 5 dnn, default engine", cv5_run, cv5_version),
        Consumer("opencv5-classic", "OpenCV 5 dnn, ENGINE_CLASSIC", cv5c_run, cv5_version),
        Consumer("candle", "candle-onnx (tests/consumers/candle)",
                 lambda m, i, o: run_command([candle, m, i, o]),
                 lambda: lock_version(candle_lock, "candle-onnx")),
        Consumer("candle-ln-decomposed", "candle-onnx, LayerNormalization decomposed by the test",
                 lambda m, i, o: run_command([candle, m, i, o]),
                 lambda: lock_version(candle_lock, "candle-onnx"), prepare=decompose_layernorm),
    ]


# --- models, inputs, comparison --------------------------------------------------------------

def make_inputs(model_path, out_path, seed=0, batch=2):
    """Seeded inputs for every graph input: floats in [−1, 1), token ids in [0, vocab).
    Symbolic dimensions: `batch` = 2, `sequence` (causal token models) = n − 3 (a length
    the graph must slice W for), `past_sequence` (with-past models) and
    `past_shift_sequence` (token-shift windows) and `past_window_K` (local windows) = 0
    (empty state, as for a prompt); a static-state file's `position` = 1, 2, ... per
    sequence, its fixed-size state random."""
    proto = onnx.load(model_path, load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    config = json.loads(meta.get("gmlp_onnx.config", "{}"))
    task = config.get("task", {})
    tokens = task if task.get("kind") == "tokens" else {}
    vocab = tokens.get("vocab_size") or 2
    symbols = {"batch": batch, "sequence": max(1, (tokens.get("seq_len") or 4) - 3),
               "past_sequence": 0, "past_shift_sequence": 0}
    rng = np.random.default_rng(seed)
    arrays = {}
    for value in proto.graph.input:
        t = value.type.tensor_type
        # Any other past_* symbol (a local window's rows) is an empty state too.
        dims = [d.dim_value if d.HasField("dim_value")
                else symbols.get(d.dim_param, 0 if d.dim_param.startswith("past_") else None)
                for d in t.shape.dim]
        if None in dims:
            raise SystemExit(f"matrix.py: input {value.name} of {model_path}: unknown symbol in {t.shape}")
        if value.name == "position":
            # Static-state files (`--with-past static`): each sequence at its own position
            # (1, 2, ...), with room for the `sequence` new tokens; the state's rows before
            # it are the random floats below, rows after it are never read.
            arrays[value.name] = np.arange(1, dims[0] + 1, dtype=np.int64)
        elif t.elem_type == onnx.TensorProto.INT64:
            arrays[value.name] = rng.integers(0, vocab, size=dims, dtype=np.int64)
        elif t.elem_type == onnx.TensorProto.FLOAT:
            arrays[value.name] = rng.uniform(-1, 1, size=dims).astype(np.float32)
        else:
            raise SystemExit(f"matrix.py: input {value.name} of {model_path}: unsupported type")
    np.savez(out_path, **arrays)
    return list(arrays)


def compare(outputs_path, reference, output_names):
    """Largest normwise relative difference over the outputs, or an error message."""
    with np.load(outputs_path) as archive:
        got = {name: archive[name] for name in archive.files}
    worst = 0.0
    for index, name in enumerate(output_names):
        ref = reference[name].astype(np.float64)
        # Consumers that do not keep the graph's names (OpenCV) return outputs in graph order.
        value = got.get(name)
        if value is None and len(got) == len(output_names):
            value = list(got.values())[index]
        if value is None:
            return None, f"output {name} missing (got {sorted(got)})"
        value = np.asarray(value, dtype=np.float64)
        if value.shape != ref.shape:
            if value.size == ref.size:
                value = value.reshape(ref.shape)  # e.g. OpenCV drops or adds unit dims
            else:
                return None, f"output {name}: shape {list(value.shape)}, expected {list(ref.shape)}"
        if not np.all(np.isfinite(value)):
            return None, f"output {name}: non-finite values"
        worst = max(worst, float(np.max(np.abs(value - ref)) / np.max(np.abs(ref))))
    return worst, ""


def build(gmlp, model, out_dir):
    path = os.path.join(out_dir, model["name"] + ".onnx")
    cmd = [gmlp, "build", *model["args"], "--init", "spread", "-q", "-o", path]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"matrix.py: {' '.join(cmd)} failed: {proc.stderr.strip()}")
    proto = onnx.load(path, load_external_data=False)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return path, {"ir_version": proto.ir_version, "opset": opset,
                  "target": dict((p.key, p.value) for p in proto.metadata_props).get("gmlp_onnx.target", "")}


def machine():
    """CPU model and core count, for the table's header."""
    model = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            model = names[0]
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs"


# --- main -----------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gmlp", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--update-docs", action="store_true",
                        help="also write docs/compatibility.md from this run")
    parser.add_argument("--models", default="",
                        help="comma-separated model names: run only these (for iterating; "
                             "refuses --update-docs)")
    parser.add_argument("--consumers", default="",
                        help="comma-separated consumer keys: run only these, after the reference "
                             "onnxruntime-python (for iterating; refuses --update-docs)")
    args = parser.parse_args()

    with open(os.path.join(HERE, "matrix.toml"), "rb") as f:
        table = tomllib.load(f)
    models = table["model"]
    expected_failures = table.get("expected_failures", {})
    os.makedirs(args.out, exist_ok=True)
    everyone = consumers(args.gmlp, args.out)
    keys = {c.key for c in everyone}
    names = {m["name"] for m in models}
    for cell in expected_failures:
        consumer, _, model = cell.rpartition(".")
        if consumer not in keys or model not in names:
            raise SystemExit(f"matrix.py: expected_failures names an unknown cell {cell!r}")

    if args.models:
        wanted = set(args.models.split(","))
        unknown = wanted - names
        if unknown:
            raise SystemExit(f"matrix.py: --models names unknown models {sorted(unknown)}")
        if args.update_docs:
            raise SystemExit("matrix.py: --update-docs needs the whole matrix (drop --models)")
        models = [m for m in models if m["name"] in wanted]
    if args.consumers:
        wanted = set(args.consumers.split(","))
        unknown = wanted - keys
        if unknown:
            raise SystemExit(f"matrix.py: --consumers names unknown consumers {sorted(unknown)}")
        if args.update_docs:
            raise SystemExit("matrix.py: --update-docs needs the whole matrix (drop --consumers)")
        # The reference always runs first: every other cell is compared with it.
        everyone = [c for i, c in enumerate(everyone) if i == 0 or c.key in wanted]

    started = time.monotonic()
    cells = []
    model_rows = []
    for model in models:
        path, facts = build(args.gmlp, model, args.out)
        inputs = os.path.join(args.out, model["name"] + ".inputs.npz")
        make_inputs(path, inputs)
        output_names = [o.name for o in onnx.load(path, load_external_data=False).graph.output]
        tol = TOL_INT8 if model.get("int8") else TOL_F16 if model.get("f16") else TOL_F32
        model_rows.append({"name": model["name"], "args": model["args"], "f16": bool(model.get("f16")),
                           "tolerance": tol, **facts})
        reference = None
        for consumer in everyone:
            t0 = time.monotonic()
            outputs = os.path.join(args.out, f"{model['name']}.{consumer.key}.npz")
            if os.path.exists(outputs):
                os.remove(outputs)
            run_path = consumer.prepare(path) if consumer.prepare else path
            ok, message = consumer.run(run_path, inputs, outputs)
            detail = consumer.detail() if ok else {}
            max_rel = None
            if ok:
                if reference is None:  # the first consumer is the reference
                    with np.load(outputs) as archive:
                        reference = {n: archive[n] for n in archive.files}
                max_rel, problem = compare(outputs, reference, output_names)
                if max_rel is None:
                    status, message = "error", problem
                else:
                    status = "pass" if max_rel <= tol else "mismatch"
                limit = model.get("webgpu_cpu_nodes")
                if status == "pass" and limit is not None and "cpu_nodes" in detail \
                        and len(detail["cpu_nodes"]) > limit:
                    status = "error"
                    message = (f"{len(detail['cpu_nodes'])} nodes on the CPU EP, at most {limit}: "
                               + ", ".join(detail["cpu_nodes"]))
            else:
                status = "error"
                if reference is None:
                    raise SystemExit(f"matrix.py: the reference failed on {model['name']}: {message}")
            cell_key = f"{consumer.key}.{model['name']}"
            expected = "fail" if cell_key in expected_failures else "pass"
            actual = "pass" if status == "pass" else "fail"
            cells.append({
                "consumer": consumer.key, "consumer_label": consumer.label,
                "version": consumer.version(), "model": model["name"], "args": model["args"],
                "ir_version": facts["ir_version"] if not consumer.prepare else onnx.load(
                    run_path, load_external_data=False).ir_version,
                "opset": facts["opset"], "status": status, "max_rel": max_rel, "tolerance": tol,
                "error": message, "expected": expected, "why_expected": expected_failures.get(cell_key, ""),
                "as_expected": expected == actual, "seconds": round(time.monotonic() - t0, 2),
                **({"detail": detail} if detail else {}),
            })
            rel = "-" if max_rel is None else f"{max_rel:.1e}"
            flag = "" if expected == actual else "   <-- UNEXPECTED"
            placed = ""
            if "cpu_nodes" in detail:
                placed = f"  CPU nodes {len(detail['cpu_nodes'])}/{detail['nodes']}: " + ", ".join(detail["cpu_nodes"])
            print(f"{model['name']:16} {consumer.key:22} {status:8} {rel:>8}  {message[:110]}{flag}{placed[:300]}",
                  flush=True)

    results = {
        "generated": datetime.date.today().isoformat(),
        "machine": machine(),
        "seconds": round(time.monotonic() - started, 1),
        "tolerance": {"f32": TOL_F32, "f16": TOL_F16, "int8": TOL_INT8},
        "consumers": [{"key": c.key, "label": c.label, "version": c.version(), "note": c.note}
                      for c in everyone],
        "models": model_rows,
        "cells": cells,
    }
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    sys.path.insert(0, HERE)
    import render  # noqa: E402 (beside this file)

    markdown = render.render(results)
    with open(os.path.join(args.out, "compatibility.md"), "w", encoding="utf-8") as f:
        f.write(markdown)
    if args.update_docs:
        with open(os.path.join(ROOT, "docs", "compatibility.md"), "w", encoding="utf-8") as f:
            f.write(markdown)

    surprises = [c for c in cells if not c["as_expected"]]
    print(f"matrix.py: {len(cells)} cells in {results['seconds']} s; "
          f"{sum(c['status'] == 'pass' for c in cells)} pass, {len(surprises)} unexpected")
    for c in surprises:
        print(f"UNEXPECTED {c['consumer']}.{c['model']}: expected {c['expected']}, got {c['status']}"
              f" (max_rel {c['max_rel']}, tolerance {c['tolerance']}) {c['error']}")
    return 1 if surprises else 0


if __name__ == "__main__":
    try:
        code = main()
    finally:
        for runner in CLOSE_AT_EXIT:
            runner.close()
    sys.exit(code)
