"""Fixtures of the gmlp_onnx tests: the small upstream modules (gmlp_models.py beside this file), the
`gmlp-onnx` command, and ONNX Runtime. Nothing here imports gmlp_onnx, so that
test_sources.py runs without the extension built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Dict, List

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gmlp_models  # noqa: E402


@pytest.fixture(scope="session")
def cases() -> Dict[str, gmlp_models.Case]:
    """Every module case by name."""
    return gmlp_models.CASES


@pytest.fixture(scope="session")
def gmlp_cli() -> str:
    """The `gmlp-onnx` command of this environment (the wheel's script, beside python)."""
    beside = os.path.join(os.path.dirname(sys.executable), "gmlp-onnx")
    for path in (beside, shutil.which("gmlp-onnx")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    pytest.fail("no gmlp-onnx command beside sys.executable or on PATH (install the wheel: maturin develop)")


@pytest.fixture(scope="session")
def run_cli(gmlp_cli):
    """Runs `gmlp-onnx ARGS...`, failing the test on a non-zero exit; returns stdout."""

    def run(*args: str) -> str:
        p = subprocess.run([gmlp_cli, *map(str, args)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"gmlp-onnx {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}"
        return p.stdout

    return run


@pytest.fixture(scope="session")
def ort_run():
    """Runs an ONNX file in ONNX Runtime (CPU): the outputs as a list, in file order."""
    import onnxruntime as ort

    def run(path: str, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return session.run(None, feeds)

    return run
