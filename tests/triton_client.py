"""Test-side client for tests/external/triton.rs: talks to a real tritonserver over HTTP with
tritonclient and compares its answers with ONNX Runtime run in this process.

Subcommands (each prints one JSON object on stdout; the Rust test asserts on it):
  toy-with-past OUT.onnx         write a small model with the with-past interface
  stateless URL NAME MODEL.onnx  concurrent single-example requests vs ONNX Runtime
  with-past URL NAME MODEL.onnx  sequences of one-token requests vs one whole-sequence run
  static URL NAME MODEL.onnx     concurrent sequences of a static-state model: a prompt each
                                 (different lengths), then one-token steps in lock step, each
                                 answer vs the sequence's own ONNX Runtime run
  stats URL NAME                 Triton's inference statistics of a model
"""

import argparse
import json
import sys
import threading
import time

import numpy as np


def onnx_io(path):
    """(inputs, outputs) of an ONNX file as lists of (name, numpy dtype, dims)."""
    import onnx
    from onnx import helper

    model = onnx.load(path, load_external_data=False)
    init = {t.name for t in model.graph.initializer}

    def describe(v):
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in t.shape.dim]
        return v.name, helper.tensor_dtype_to_np_dtype(t.elem_type), dims

    inputs = [describe(v) for v in model.graph.input if v.name not in init]
    outputs = [describe(v) for v in model.graph.output]
    return inputs, outputs


def rel(a, b):
    """Normwise relative difference max|a - b| / max|b| (as tests/common rel_diff)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = np.abs(b).max()
    assert scale > 0, "reference is all zero"
    return float(np.abs(a - b).max() / scale)


def session(path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def make_inputs(rng, inputs, int_high, batch=1):
    """One example per input, `batch` rows; symbolic dims other than the batch take 5."""
    feeds = {}
    for name, dtype, dims in inputs:
        shape = [batch] + [d if isinstance(d, int) and d > 0 else 5 for d in dims[1:]]
        if np.issubdtype(dtype, np.integer):
            feeds[name] = rng.integers(0, int_high, size=shape).astype(dtype)
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def http_client(url):
    import tritonclient.http as httpclient

    # tritonclient.http is gevent-based: one client per thread.
    return httpclient.InferenceServerClient(url=url, connection_timeout=60.0, network_timeout=120.0)


def infer(client, name, feeds, output_names, **sequence):
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for k, v in feeds.items():
        i = httpclient.InferInput(k, list(v.shape), np_to_triton_dtype(v.dtype))
        i.set_data_from_numpy(v, binary_data=True)
        inputs.append(i)
    outputs = [httpclient.InferRequestedOutput(o, binary_data=True) for o in output_names]
    result = client.infer(name, inputs, outputs=outputs, **sequence)
    return {o: result.as_numpy(o) for o in output_names}


def statistics(url, name):
    stats = http_client(url).get_inference_statistics(name)["model_stats"]
    s = next(m for m in stats if m["name"] == name)
    return {
        "inference_count": int(s.get("inference_count", 0)),
        "execution_count": int(s.get("execution_count", 0)),
        "batch_sizes": sorted(int(b["batch_size"]) for b in s.get("batch_stats", [])),
    }


def statistics_after(url, name, before, expected, timeout=10.0):
    """Statistics once `expected` more inferences are counted (Triton updates them just
    after it answers, so the last response can arrive before its count)."""
    deadline = time.monotonic() + timeout
    while True:
        after = statistics(url, name)
        if after["inference_count"] - before["inference_count"] >= expected or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def run_stateless(args):
    inputs, outputs = onnx_io(args.model)
    output_names = [o[0] for o in outputs]
    sess = session(args.model)
    rng = np.random.default_rng(args.seed)
    work = [make_inputs(rng, inputs, args.int_high) for _ in range(args.clients * args.requests)]
    expected = [dict(zip(output_names, sess.run(output_names, feeds))) for feeds in work]
    before = statistics(args.url, args.name)
    worst = [0.0] * len(work)
    errors = []
    barrier = threading.Barrier(args.clients)

    def client_thread(k):
        try:
            client = http_client(args.url)
            barrier.wait()
            for j in range(k, len(work), args.clients):
                got = infer(client, args.name, work[j], output_names)
                worst[j] = max(rel(got[o], expected[j][o]) for o in output_names)
        except Exception as e:  # reported to the Rust test, which fails on it
            errors.append(f"client {k}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client_thread, args=(k,)) for k in range(args.clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    after = statistics_after(args.url, args.name, before, len(work))
    print(json.dumps({
        "requests": len(work),
        "errors": errors,
        "max_rel": max(worst),
        "seconds": seconds,
        "inference_count": after["inference_count"] - before["inference_count"],
        "execution_count": after["execution_count"] - before["execution_count"],
        "batch_sizes": after["batch_sizes"],
    }))


def run_with_past(args):
    """Several sequences at once (staggered, so their states differ in length), one token
    per request; Triton keeps the state. Each step's logits must equal the matching row of
    one whole-sequence ONNX Runtime run that starts from an empty past."""
    inputs, outputs = onnx_io(args.model)
    pasts = [(n, t, d) for n, t, d in inputs if n.startswith("past_")]
    sess = session(args.model)
    rng = np.random.default_rng(args.seed)
    sequences = [rng.integers(0, args.int_high, size=(1, args.steps)).astype(np.int64)
                 for _ in range(args.sequences)]
    expected = []
    for ids in sequences:
        feeds = {"input_ids": ids}
        for n, t, d in pasts:
            feeds[n] = np.zeros([1, 0] + [x for x in d[2:]], dtype=t)
        expected.append(sess.run(["logits"], feeds)[0])
    worst = [0.0] * len(sequences)
    errors = []
    spans = [[None, None] for _ in sequences]  # first and last response time per sequence
    # Sequence k starts once sequence 0 has sent k tokens: states of different lengths
    # are then in flight together.
    started = [threading.Event() for _ in sequences]
    started[0].set()
    # Sequence 0 sends its last token only once every other sequence has had an answer (or
    # after a timeout): a server that served sequences one after another could not give
    # those answers, so the spans below then show it; a busy machine cannot fake it.
    answered = [threading.Event() for _ in sequences]
    before = statistics(args.url, args.name)

    def sequence_thread(k):
        try:
            client = http_client(args.url)
            if not started[k].wait(timeout=120):
                raise TimeoutError("sequence 0 did not advance")
            for t in range(args.steps):
                if k == 0 and 0 < t < len(started):
                    started[t].set()
                if k == 0 and t == args.steps - 1:
                    for ev in answered[1:]:
                        ev.wait(timeout=60)
                got = infer(client, args.name, {"input_ids": sequences[k][:, t:t + 1]}, ["logits"],
                            sequence_id=1000 + k, sequence_start=(t == 0),
                            sequence_end=(t == args.steps - 1))["logits"]
                worst[k] = max(worst[k], rel(got[0, 0], expected[k][0, t]))
                now = time.monotonic()
                spans[k][0] = spans[k][0] or now
                spans[k][1] = now
                answered[k].set()
        except Exception as e:
            errors.append(f"sequence {k}: {type(e).__name__}: {e}")
        finally:
            # Nobody waits for a thread that has ended: its own answer event, and if it is
            # sequence 0 the start of every other. (Setting every event here let sequence 0
            # send its last token before a slow sequence's first answer, on a loaded machine.)
            answered[k].set()
            if k == 0:
                for ev in started:
                    ev.set()

    threads = [threading.Thread(target=sequence_thread, args=(k,)) for k in range(args.sequences)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = statistics_after(args.url, args.name, before, args.sequences * args.steps)
    print(json.dumps({
        "sequences": args.sequences,
        "steps": args.steps,
        "errors": errors,
        "max_rel": max(worst),
        "inference_count": after["inference_count"] - before["inference_count"],
        "execution_count": after["execution_count"] - before["execution_count"],
        # Every later sequence got its first answer before sequence 0 got its last: the
        # sequences were served interleaved, none waited for another to end.
        "interleaved": all(s[0] is not None and spans[0][1] is not None and s[0] < spans[0][1]
                           for s in spans[1:]),
    }))


def run_static(args):
    """A static-state model (docs/static-state.md): `args.sequences` sequences with prompts
    of different lengths, sent concurrently; then `args.steps` one-token requests per
    sequence, all sequences in lock step so that Triton's sequence batcher can put them in
    one execution. Every request carries its sequence's `position` (tokens sent before).
    Each answer must equal the matching rows of one ONNX Runtime run of the same file on
    the sequence's whole token list from position 0 and zero state."""
    inputs, outputs = onnx_io(args.model)
    pasts = [(n, t, d) for n, t, d in inputs if n.startswith("past_")]
    sess = session(args.model)
    rng = np.random.default_rng(args.seed)
    lengths = [args.prompt_min + k for k in range(args.sequences)]
    sequences = [rng.integers(0, args.int_high, size=(1, n + args.steps)).astype(np.int64)
                 for n in lengths]
    expected = []
    for ids in sequences:
        feeds = {"input_ids": ids, "position": np.zeros([1], dtype=np.int64)}
        for n, t, d in pasts:
            feeds[n] = np.zeros([1] + d[1:], dtype=t)
        expected.append(sess.run(["logits"], feeds)[0])
    worst = [0.0] * len(sequences)
    errors = []
    barrier = threading.Barrier(args.sequences)
    before = statistics(args.url, args.name)

    def sequence_thread(k):
        try:
            client = http_client(args.url)
            n = lengths[k]
            barrier.wait(timeout=120)
            got = infer(client, args.name,
                        {"input_ids": sequences[k][:, :n], "position": np.array([[0]], dtype=np.int64)},
                        ["logits"], sequence_id=2000 + k, sequence_start=True)["logits"]
            worst[k] = rel(got[0], expected[k][0, :n])
            for t in range(args.steps):
                barrier.wait(timeout=120)
                p = n + t
                got = infer(client, args.name,
                            {"input_ids": sequences[k][:, p:p + 1],
                             "position": np.array([[p]], dtype=np.int64)},
                            ["logits"], sequence_id=2000 + k,
                            sequence_end=(t == args.steps - 1))["logits"]
                worst[k] = max(worst[k], rel(got[0, 0], expected[k][0, p]))
        except Exception as e:
            errors.append(f"sequence {k}: {type(e).__name__}: {e}")
            barrier.abort()

    threads = [threading.Thread(target=sequence_thread, args=(k,)) for k in range(args.sequences)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    requests = args.sequences * (1 + args.steps)
    after = statistics_after(args.url, args.name, before, requests)
    print(json.dumps({
        "sequences": args.sequences,
        "prompt_lengths": lengths,
        "steps": args.steps,
        "errors": errors,
        "max_rel": max(worst),
        "inference_count": after["inference_count"] - before["inference_count"],
        "execution_count": after["execution_count"] - before["execution_count"],
        "batch_sizes": after["batch_sizes"],
    }))


def make_toy_with_past(args):
    """input_ids [batch, sequence] int64 and past_sgu.0 [batch, past_sequence, 4] →
    present_sgu.0 = Concat(past, embedding(ids)) and logits [batch, sequence, vocab] from
    the running sum over the whole state plus the absolute position, so a lost, repeated
    or foreign state changes every later logit."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(7)
    vocab, e = args.vocab, 4
    emb = helper.make_tensor("embedding", TensorProto.FLOAT, [vocab, e],
                             rng.standard_normal((vocab, e)).astype(np.float32).ravel())
    head = helper.make_tensor("head", TensorProto.FLOAT, [e, vocab],
                              rng.standard_normal((e, vocab)).astype(np.float32).ravel())
    consts = [
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("big", TensorProto.INT64, [1], [2**62]),
        helper.make_tensor("zero_s", TensorProto.INT64, [], [0]),
        helper.make_tensor("one_s", TensorProto.INT64, [], [1]),
        helper.make_tensor("pos_scale", TensorProto.FLOAT, [], [0.25]),
        helper.make_tensor("axes_02", TensorProto.INT64, [2], [0, 2]),
    ]
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["x"]),
        helper.make_node("Concat", ["past_sgu.0", "x"], ["present_sgu.0"], axis=1),
        helper.make_node("CumSum", ["present_sgu.0", "axis1"], ["running"]),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Gather", ["ids_shape", "one"], ["s"], axis=0),
        helper.make_node("Neg", ["s"], ["minus_s"]),
        helper.make_node("Slice", ["running", "minus_s", "big", "axis1"], ["recent"]),
        helper.make_node("Shape", ["past_sgu.0"], ["past_shape"]),
        helper.make_node("Gather", ["past_shape", "one_s"], ["past_len"], axis=0),
        helper.make_node("Shape", ["present_sgu.0"], ["total_shape"]),
        helper.make_node("Gather", ["total_shape", "one_s"], ["total_len"], axis=0),
        helper.make_node("Range", ["past_len", "total_len", "one_s"], ["positions"]),
        helper.make_node("Cast", ["positions"], ["positions_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["positions_f", "pos_scale"], ["pos_term"]),
        helper.make_node("Unsqueeze", ["pos_term", "axes_02"], ["pos_b"]),
        helper.make_node("Add", ["recent", "pos_b"], ["h"]),
        helper.make_node("Tanh", ["h"], ["t"]),
        helper.make_node("MatMul", ["t", "head"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "toy_with_past",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("past_sgu.0", TensorProto.FLOAT, ["batch", "past_sequence", e])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab]),
         helper.make_tensor_value_info("present_sgu.0", TensorProto.FLOAT, ["batch", "total_sequence", e])],
        initializer=[emb, head] + consts,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, args.out)
    print(json.dumps({"written": args.out}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("toy-with-past")
    t.add_argument("out")
    t.add_argument("--vocab", type=int, default=11)
    for name in ("stateless", "with-past", "static"):
        s = sub.add_parser(name)
        s.add_argument("url")
        s.add_argument("name")
        s.add_argument("model")
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--int-high", type=int, default=10, help="integer inputs lie in [0, this)")
        if name == "stateless":
            s.add_argument("--clients", type=int, default=4)
            s.add_argument("--requests", type=int, default=8, help="per client")
        else:
            s.add_argument("--sequences", type=int, default=3)
            s.add_argument("--steps", type=int, default=6)
        if name == "static":
            s.add_argument("--prompt-min", type=int, default=2,
                           help="sequence k's prompt has this + k tokens")
    st = sub.add_parser("stats")
    st.add_argument("url")
    st.add_argument("name")
    args = p.parse_args()
    if args.command == "toy-with-past":
        make_toy_with_past(args)
    elif args.command == "stateless":
        run_stateless(args)
    elif args.command == "with-past":
        run_with_past(args)
    elif args.command == "static":
        run_static(args)
    else:
        print(json.dumps(statistics(args.url, args.name)))


if __name__ == "__main__":
    sys.exit(main())
