"""Two static-state files' decode steps interleaved in one process on ONNX Runtime's CPU
provider: each session's state bound in place (I/O binding, past and present the same
buffer, as `gmlp-onnx generate` runs it), a prompt of `--prompt` tokens, then `--steps`
one-token steps of A and B in turn (the order swapped every pair), so that the load of a
shared machine hits both alike. Prints the median step of each, B / A of the medians and
the median of the pairs' ratios.

Usage: python3 bench/step_interleaved.py A.onnx B.onnx [--threads 2] [--steps 300]
       [--prompt 448] [--batch 1]
Bench helper only: needs onnxruntime and numpy.
"""
import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort


def stepper(path, threads, batch, prompt):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    pasts = [i for i in sess.get_inputs() if i.name.startswith("past_")]
    state = {i.name: ort.OrtValue.ortvalue_from_numpy(np.zeros([batch] + i.shape[1:], np.float32))
             for i in pasts}

    def binding(ids, position):
        b = sess.io_binding()
        b.bind_cpu_input("input_ids", ids)
        b.bind_cpu_input("position", position)
        for name, v in state.items():
            b.bind_ortvalue_input(name, v)
            b.bind_ortvalue_output(name.replace("past_", "present_", 1), v)
        b.bind_output("logits")
        return b

    ids = (np.arange(batch * prompt, dtype=np.int64) * 7919 % 32000).reshape(batch, prompt)
    sess.run_with_iobinding(binding(ids, np.zeros([batch], np.int64)))
    step = binding(np.ones([batch, 1], np.int64), np.full([batch], prompt, np.int64))

    def run():
        t = time.perf_counter()
        sess.run_with_iobinding(step)
        return (time.perf_counter() - t) * 1e3
    for _ in range(5):
        run()
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--prompt", type=int, default=448)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()
    run_a = stepper(a.a, a.threads, a.batch, a.prompt)
    run_b = stepper(a.b, a.threads, a.batch, a.prompt)
    ta, tb = [], []
    for k in range(a.steps):
        if k % 2:
            ta.append(run_a()); tb.append(run_b())
        else:
            tb.append(run_b()); ta.append(run_a())
    ma, mb = statistics.median(ta), statistics.median(tb)
    pairs = statistics.median(y / x for x, y in zip(ta, tb))
    print(f"| {a.batch} | {a.threads} | {a.steps} | {ma:.3f} | {mb:.3f} | {mb / ma:.3f} | {pairs:.3f} |")


if __name__ == "__main__":
    main()
