"""Run by hand (torch is too large for CI): converts every model of the consumer matrix with
onnx2torch, runs it in PyTorch on the matrix's inputs and compares with ONNX Runtime's
outputs the same way the matrix does. Prints one Markdown table row per model.

Usage: VENV/bin/python by_hand_onnx2torch.py DIR   (DIR: target/tmp/consumers after a run of
tests/external/consumers.rs; VENV with onnx2torch, torch, onnx, numpy)
"""
import json
import os
import sys

import numpy as np
import onnx
import onnx2torch
import torch


def main(directory):
    with open(os.path.join(directory, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    print(f"onnx2torch {getattr(onnx2torch, '__version__', '1.5.15')}, torch {torch.__version__}")
    for model in results["models"]:
        name = model["name"]
        path = os.path.join(directory, name + ".onnx")
        with np.load(os.path.join(directory, name + ".inputs.npz")) as archive:
            inputs = [torch.from_numpy(archive[i.name]) for i in onnx.load(path).graph.input]
        with np.load(os.path.join(directory, name + ".onnxruntime-python.npz")) as archive:
            reference = archive[archive.files[0]].astype(np.float64)
        try:
            module = onnx2torch.convert(path)
            with torch.no_grad():
                out = module(*inputs)
            out = (out[0] if isinstance(out, (list, tuple)) else out).numpy().astype(np.float64)
            rel = float(np.max(np.abs(out - reference)) / np.max(np.abs(reference)))
            verdict = "pass" if rel <= model["tolerance"] else "mismatch"
            print(f"| {name} | {verdict} | {rel:.1e} | |")
        except Exception as exc:  # the converter's own message goes into the table
            message = " ".join(str(exc).split())[:300]
            print(f"| {name} | error | – | `{type(exc).__name__}: {message}` |")


if __name__ == "__main__":
    main(sys.argv[1])
