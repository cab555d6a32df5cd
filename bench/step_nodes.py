"""Nodes ONNX Runtime runs per step of a model, after its own fusions (ORT_ENABLE_ALL on
the CPU provider): saves the optimized graph and counts its nodes per operator type
(the decode step's kernel count: on a GPU every node is at least one kernel launch).

Usage: python3 bench/step_nodes.py MODEL.onnx [MODEL2.onnx ...] [--json]
Prints one line per model (total, then the types by count). Bench helper only: needs
onnxruntime and onnx.
"""
import argparse
import collections
import json
import os
import sys
import tempfile

import onnx
import onnxruntime as ort


def optimized_nodes(model):
    """The op-type counts of ONNX Runtime's optimized graph of `model` (CPU provider)."""
    tmp = tempfile.mkdtemp(prefix="gmlp-nodes-")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "opt.data")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    graph = onnx.load(so.optimized_model_filepath, load_external_data=False).graph
    counts = collections.Counter(n.op_type for n in graph.node)
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    os.rmdir(tmp)
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = {m: optimized_nodes(m) for m in a.models}
    if a.json:
        json.dump({m: {"total": sum(c.values()), "ops": dict(c.most_common())} for m, c in results.items()},
                  sys.stdout, indent=1)
        print()
        return
    for m, c in results.items():
        ops = ", ".join(f"{n} {op}" for op, n in c.most_common())
        print(f"{os.path.basename(m)}: {sum(c.values())} nodes: {ops}")


if __name__ == "__main__":
    main()
