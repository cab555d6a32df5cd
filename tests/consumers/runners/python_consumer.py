"""Runs an ONNX file in one Python consumer of the matrix (tests/external/consumers.rs).

Usage: python python_consumer.py CONSUMER MODEL.onnx INPUTS.npz OUTPUTS.npz
CONSUMER: onnxruntime | onnx-reference | openvino | opencv | opencv-classic
Writes every graph output to OUTPUTS.npz, by name. On failure prints one line to stderr
(the consumer's own message) and exits 1. Prints the consumer's version with
`python python_consumer.py CONSUMER --version`.
"""
import sys

import numpy as np


def version(consumer):
    if consumer == "onnxruntime":
        import onnxruntime

        return onnxruntime.__version__
    if consumer == "onnx-reference":
        import onnx

        return onnx.__version__
    if consumer == "openvino":
        import openvino

        return openvino.get_version().split("-")[0]
    if consumer.startswith("opencv"):
        import cv2

        return cv2.__version__
    raise ValueError(f"unknown consumer {consumer}")


def run_onnxruntime(model, feeds):
    import onnxruntime

    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def run_onnx_reference(model, feeds):
    import onnx
    from onnx.reference import ReferenceEvaluator

    proto = onnx.load(model)
    names = [o.name for o in proto.graph.output]
    return dict(zip(names, ReferenceEvaluator(proto).run(names, feeds)))


def run_openvino(model, feeds):
    import openvino

    core = openvino.Core()
    # On CPUs with AVX512-BF16/AMX, OpenVINO computes in bf16 unless told otherwise.
    compiled = core.compile_model(core.read_model(model), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    results = compiled(feeds)
    return {port.get_any_name(): np.asarray(results[port]) for port in compiled.outputs}


def run_opencv(model, feeds, engine=None):
    import cv2

    if engine is None:
        net = cv2.dnn.readNetFromONNX(model)
    else:
        net = cv2.dnn.readNetFromONNX(model, engine=engine)
    for name, value in feeds.items():
        net.setInput(value, name)
    names = list(net.getUnconnectedOutLayersNames())
    outs = net.forward(names)
    return dict(zip(names, (np.asarray(o) for o in outs)))


def run(consumer, model, feeds):
    if consumer == "onnxruntime":
        return run_onnxruntime(model, feeds)
    if consumer == "onnx-reference":
        return run_onnx_reference(model, feeds)
    if consumer == "openvino":
        return run_openvino(model, feeds)
    if consumer == "opencv":
        return run_opencv(model, feeds)
    if consumer == "opencv-classic":
        import cv2

        return run_opencv(model, feeds, engine=cv2.dnn.ENGINE_CLASSIC)
    raise ValueError(f"unknown consumer {consumer}")


def main(argv):
    consumer = argv[1]
    if argv[2:] == ["--version"]:
        print(version(consumer))
        return 0
    model, inputs, outputs = argv[2:5]
    with np.load(inputs) as archive:
        feeds = {name: archive[name] for name in archive.files}
    try:
        results = run(consumer, model, feeds)
    except Exception as exc:  # consumers raise their own exception types
        message = " ".join(str(exc).split())
        print(f"{type(exc).__name__}: {message}", file=sys.stderr)
        return 1
    np.savez(outputs, **{name: np.asarray(value) for name, value in results.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
