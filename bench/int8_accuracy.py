"""Accuracy of `--dtype int8` on the trained fixtures, against the f32 export of the same
weights and against ONNX Runtime's own `quantize_dynamic` (per-channel int8) of that f32 file.

For each fixture (fixtures/*/model.safetensors with its inputs in io.safetensors): builds the
f32 and the int8 model with the release CLI, runs them in ONNX Runtime (Python) and tract
(`gmlp-onnx validate --runtimes tract --save-outputs`), and reports
  - classifiers: test accuracy on the fixture's labels (f32, int8 ORT, int8 tract, quantize_dynamic);
  - token models: next-token top-1 agreement with f32 over every position, and the logits'
    relative error max|q − f32| / max|f32|.
Prints Markdown. Usage: python bench/int8_accuracy.py [--work DIR] [--json]
Needs onnxruntime, numpy, safetensors (numpy API). Bench helper only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXE = os.path.join(ROOT, "target", "release", "gmlp-onnx")
FIXTURES = ["timm_gmlp_vision", "lucid_vision", "lucid_tokens", "lucid_tokens_causal", "lucid_amlp",
            "lucid_amlp_causal", "lucid_heads2", "lucid_shift"]


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def flags_for(meta):
    f = meta.get("flags", {})
    out = []
    if f.get("causal"):
        out.append("--causal")
    if f.get("shift_tokens"):
        out += ["--shift-tokens", str(f["shift_tokens"])]
    if f.get("in_chans"):
        out += ["--in-chans", str(f["in_chans"])]
    return out


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def tract_run(model, inputs_npz, work):
    out = os.path.join(work, "tract_out.npz")
    sh([EXE, "validate", model, "--runtimes", "tract", "--inputs", inputs_npz, "--save-outputs", out])
    return np.load(out)["logits"]


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="gmlp-int8-acc-")
    os.makedirs(work, exist_ok=True)
    rows = []
    for name in FIXTURES:
        d = os.path.join(ROOT, "fixtures", name)
        meta = json.load(open(os.path.join(d, "meta.json")))
        io = load_file(os.path.join(d, "io.safetensors"))
        inp = meta["input_name"]
        feeds = {inp: io[inp]}
        inputs_npz = os.path.join(work, f"{name}_in.npz")
        np.savez(inputs_npz, **feeds)
        f32 = os.path.join(work, f"{name}.onnx")
        q8 = os.path.join(work, f"{name}.int8.onnx")
        qd = os.path.join(work, f"{name}.qdyn.onnx")
        w = os.path.join(d, "model.safetensors")
        sh([EXE, "build", "--weights", w, *flags_for(meta), "-o", f32, "-q"])
        sh([EXE, "build", "--weights", w, *flags_for(meta), "--dtype", "int8", "-o", q8, "-q"])
        quantize_dynamic(f32, qd, weight_type=QuantType.QInt8, per_channel=True)
        ref = ort_run(f32, feeds)
        outs = {"int8 (ORT)": ort_run(q8, feeds), "int8 (tract)": tract_run(q8, inputs_npz, work),
                "quantize_dynamic (ORT)": ort_run(qd, feeds)}
        row = {"fixture": name, "kind": "classifier" if "labels" in io else "tokens",
               "f32_vs_pytorch": rel(ref, io["logits"]), "bytes": {k: os.path.getsize(p) for k, p in
                                                                  (("f32", f32), ("int8", q8), ("qdyn", qd))}}
        if "labels" in io:
            labels = io["labels"]
            row["f32_accuracy"] = float((ref.argmax(-1) == labels).mean())
            row["n"] = int(labels.size)
        for k, o in outs.items():
            r = {"rel_err": rel(o, ref), "top1_agree": float((o.argmax(-1) == ref.argmax(-1)).mean())}
            if "labels" in io:
                r["accuracy"] = float((o.argmax(-1) == io["labels"]).mean())
            row[k] = r
        row["tract_vs_ort_int8"] = rel(outs["int8 (tract)"], outs["int8 (ORT)"])
        rows.append(row)
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        return
    print("| fixture | metric | f32 | int8 (ORT) | int8 (tract) | quantize_dynamic (ORT) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ks = ["int8 (ORT)", "int8 (tract)", "quantize_dynamic (ORT)"]
        if r["kind"] == "classifier":
            print(f"| {r['fixture']} | test accuracy ({r['n']} images) | {100 * r['f32_accuracy']:.1f}% | " +
                  " | ".join(f"{100 * r[k]['accuracy']:.1f}%" for k in ks) + " |")
        print(f"| {r['fixture']} | top-1 agreement with f32 | 100% | " +
              " | ".join(f"{100 * r[k]['top1_agree']:.1f}%" for k in ks) + " |")
        print(f"| {r['fixture']} | logits max rel err vs f32 | – | " +
              " | ".join(f"{r[k]['rel_err']:.1e}" for k in ks) + " |")
    print()
    print("tract vs ONNX Runtime on the int8 files (max|diff| / max|ORT|): " +
          ", ".join(f"{r['fixture']} {r['tract_vs_ort_int8']:.1e}" for r in rows))


if __name__ == "__main__":
    main()
