"""Run by hand (TensorFlow is too large for CI): converts models of the consumer matrix with
onnx2tf (batch fixed to B, `-b B`), runs the float32 TFLite file in tf.lite.Interpreter (it
carries the Flex delegate the converted Split needs) on the matrix's inputs, B examples per
call, and compares with ONNX Runtime's outputs the same way the matrix does. Prints one
Markdown table row per model.

Usage: VENV/bin/python by_hand_onnx2tf.py [--batch B] DIR WORK [MODEL...]
  DIR: target/tmp/consumers after a run of tests/external/consumers.rs; WORK: a scratch folder;
  VENV with onnx2tf and its TensorFlow; B: 2 (the matrix's batch, default) or 1;
  MODEL...: only these models of the run (default all).
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np


def main(directory, work, only, batch):
    import tensorflow as tf

    with open(os.path.join(directory, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    for model in results["models"]:
        name = model["name"]
        if only and name not in only:
            continue
        out_dir = os.path.join(work, f"{name}.b{batch}")
        os.makedirs(out_dir, exist_ok=True)
        # onnx2tf rewrites its input file in place (onnxsim): give it a copy.
        path = os.path.join(out_dir, name + ".onnx")
        shutil.copyfile(os.path.join(directory, name + ".onnx"), path)
        with np.load(os.path.join(directory, name + ".inputs.npz")) as archive:
            inputs = {k: archive[k] for k in archive.files}
        with np.load(os.path.join(directory, name + ".onnxruntime-python.npz")) as archive:
            reference = archive[archive.files[0]].astype(np.float64)
        cmd = [os.path.join(os.path.dirname(sys.executable), "onnx2tf"), "-i", path, "-o", out_dir,
               "-b", str(batch), "-n"]
        # Image inputs: onnx2tf turns them NHWC and downloads calibration data from github.com.
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].transpose(0, 2, 3, 1)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        tflite = sorted(glob.glob(os.path.join(out_dir, "*_float32.tflite")))
        if proc.returncode != 0 or not tflite:
            lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "rror" in line]
            message = " ".join((lines[-1] if lines else "no tflite file written").split())[:300]
            print(f"| {name} | `-b {batch}` | error | – | `{message}` |", flush=True)
            continue
        try:
            interpreter = tf.lite.Interpreter(model_path=tflite[0])
            interpreter.allocate_tensors()
            details = interpreter.get_input_details()
            examples = len(next(iter(inputs.values())))
            outs = []
            for start in range(0, examples, batch):
                for detail in details:
                    key = detail["name"].split(":")[0] if len(details) > 1 else next(iter(inputs))
                    value = inputs[key][start:start + batch]
                    interpreter.set_tensor(detail["index"], value.astype(detail["dtype"]))
                interpreter.invoke()
                outs.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
            out = np.concatenate(outs).astype(np.float64)
            rel = float(np.max(np.abs(out.reshape(reference.shape) - reference)) / np.max(np.abs(reference)))
            verdict = "pass" if rel <= model["tolerance"] else "mismatch"
            print(f"| {name} | `-b {batch}` | {verdict} | {rel:.1e} | |", flush=True)
        except Exception as exc:  # LiteRT's own message goes into the table
            print(f"| {name} | `-b {batch}` | error | – | `{type(exc).__name__}: {' '.join(str(exc).split())[:300]}` |")


if __name__ == "__main__":
    args = sys.argv[1:]
    batch = 2
    if args[:1] == ["--batch"]:
        batch, args = int(args[1]), args[2:]
    main(args[0], args[1], set(args[2:]), batch)
