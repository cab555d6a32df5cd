"""Checks ONNX files with the reference checker: onnx.checker.check_model(full_check=True),
then strict shape inference (onnx.shape_inference.infer_shapes with check_type, strict_mode
and data_prop), which fails on any node whose inputs' types or shapes its operator version
does not accept.

Usage: python check_onnx.py MODEL.onnx [...]; prints one line per file, exits 1 on any failure.
"""
import sys

import onnx


def main(paths):
    failed = 0
    for path in paths:
        try:
            onnx.checker.check_model(path, full_check=True)
            onnx.shape_inference.infer_shapes(
                onnx.load(path), check_type=True, strict_mode=True, data_prop=True
            )
            print(f"ok {path}")
        except Exception as exc:  # the checker raises several exception types
            failed += 1
            print(f"FAIL {path}: {exc}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
