"""How matrix.py runs a consumer: a command and its one-line message, NumPy archives as the
JSON the Node.js runners read and write, the onnxruntime-node runner (one process a file) and
the onnxruntime-web one (one headless Chromium for the whole run, per backend: WASM or
WebGPU)."""
import json
import os
import re
import selectors
import signal
import subprocess

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_RUNNER = os.path.join(HERE, "runners", "ort_node.js")
WEB_RUNNER = os.path.join(HERE, "runners", "ort_web.js")
RUN_TIMEOUT_S = 300


def one_line(text, limit=600):
    """The last non-empty line of a consumer's stderr (its message), whitespace collapsed."""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    # Skip log lines that come before the message (OpenCV, ONNX Runtime warnings).
    errors = [line for line in lines if re.search(r"error|Error|ERROR|fail|Fail|not |unsupported|Unsupported", line)]
    chosen = (errors or lines or ["(no message)"])[-1]
    # Drop what says where in the consumer's C++ the error was raised, keep what it says.
    chosen = re.sub(r" in function '[^']*'", "", chosen)
    chosen = re.sub(r"\(-\d+:[^)]*\) ?|(?<=\s)>(?=\s)|OpenCV\([\d.]+\) ", "", chosen)
    chosen = re.sub(r"(?:virtual )?(?:void )?\w[\w~<>]*(?:::[\w~<>]+)+\([^()]*\)(?: const)? ", "", chosen)
    chosen = re.sub(r"/\S+\.(?:cpp|cc|h|hpp):\d+:?", "", chosen)
    chosen = re.sub(r"/\S*/([^/\s]+\.onnx)", r"\1", chosen)
    chosen = re.sub(r"(error: )+", "error: ", " ".join(chosen.split()))
    return chosen if len(chosen) <= limit else chosen[: limit - 1] + "…"


def run_command(cmd):
    """(ok, message) of a consumer command."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {RUN_TIMEOUT_S} s"
    if proc.returncode == 0:
        return True, ""
    if proc.returncode < 0:
        return False, f"killed by signal {-proc.returncode} {one_line(proc.stderr)}".strip()
    return False, one_line(proc.stderr + "\n" + proc.stdout)


def npz_to_json(npz_path, json_path):
    with np.load(npz_path) as archive:
        doc = {}
        for name in archive.files:
            a = archive[name]
            kind = "int64" if a.dtype.kind in "iu" else "float32"
            doc[name] = {"type": kind, "dims": list(a.shape),
                         "data": a.astype(np.int64 if kind == "int64" else np.float32).ravel().tolist()}
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def json_to_npz(json_path, npz_path):
    with open(json_path, encoding="utf-8") as f:
        doc = json.load(f)
    arrays = {}
    for name, t in doc.items():
        dtype = {"float32": np.float32, "float16": np.float16, "int64": np.int64}.get(t["type"], np.float64)
        arrays[name] = np.asarray(t["data"], dtype=dtype).reshape(t["dims"])
    np.savez(npz_path, **arrays)


def node_consumer(modules):
    def run(model, inputs, outputs):
        in_json, out_json = outputs + ".in.json", outputs + ".out.json"
        npz_to_json(inputs, in_json)
        ok, message = run_command(["node", NODE_RUNNER, modules, model, in_json, out_json])
        if ok:
            json_to_npz(out_json, outputs)
        return ok, message

    def version():
        return subprocess.run(["node", NODE_RUNNER, modules, "--version"], capture_output=True,
                              text=True, check=True).stdout.strip()

    return run, version


# Consumers holding a process open across cells, closed when matrix.py ends (even on error).
CLOSE_AT_EXIT = []


class BrowserConsumer:
    """onnxruntime-web in headless Chromium on the execution provider `ep` ("wasm" or
    "webgpu"): one `node ort_web.js MODULES --ep EP --serve` process (one browser, a fresh
    page for every file) for the whole run, started at the first cell and started again
    after a cell that kills it or runs past RUN_TIMEOUT_S. `last_detail` holds what the
    runner said of the last passing run beyond its outputs (with WebGPU: "nodes" and
    "cpu_nodes", the nodes ONNX Runtime placed on its CPU provider)."""

    def __init__(self, modules, log_path, ep="wasm"):
        self.modules, self.log_path, self.ep = modules, log_path, ep
        self.proc = None
        self.last_detail = {}
        CLOSE_AT_EXIT.append(self)

    def _start(self):
        self.log = open(self.log_path, "ab")
        # Its own process group: a stuck browser is ended with its node parent.
        self.proc = subprocess.Popen(["node", WEB_RUNNER, self.modules, "--ep", self.ep, "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, start_new_session=True)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)

    def _stderr_tail(self):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read()[-4000:].decode("utf-8", "replace")

    def run(self, model, inputs, outputs):
        self.last_detail = {}
        in_json, out_json = outputs + ".in.json", outputs + ".out.json"
        npz_to_json(inputs, in_json)
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        job = {"model": os.path.abspath(model), "inputs": os.path.abspath(in_json),
               "outputs": os.path.abspath(out_json)}
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return False, one_line(self._stderr_tail()) or "ort_web.js exited"
        if not self.selector.select(timeout=RUN_TIMEOUT_S):
            self.close()
            return False, f"timed out after {RUN_TIMEOUT_S} s"
        line = self.proc.stdout.readline()
        if not line:
            message = one_line(self._stderr_tail())
            self.close()
            return False, message
        try:
            answer = json.loads(line)
        except ValueError:
            return False, one_line(f"ort_web.js answered {line!r}")
        if not answer["ok"]:
            return False, one_line(answer["error"])
        json_to_npz(out_json, outputs)
        self.last_detail = {k: v for k, v in answer.items() if k != "ok"}
        return True, ""

    def version(self):
        return subprocess.run(["node", WEB_RUNNER, self.modules, "--ep", self.ep, "--version"],
                              capture_output=True, text=True, check=True).stdout.strip()

    def close(self):
        """Ends the runner: stdin closed (it closes the browser), then its process group."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of its group is left
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.selector.close()
        self.log.close()
        self.proc = None
