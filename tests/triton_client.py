"""Test-side client for tests/external/triton.rs: talks to a real tritonserver over HTTP with
tritonclient and compares its answers with ONNX Runtime run in this process.

Subcommands (each prints one JSON object on stdout; the Rust test asserts on it):
  toy-with-past OUT.onnx         write a small model with the with-past interface
  stateless URL NAME MODEL.onnx  concurrent single-example requests vs ONNX Runtime
  with-past URL NAME MODEL.onnx  sequences of one-token requests vs one whole-sequence run
  static URL NAME MODEL.onnx     concurrent sequences of a static-state model: a prompt each
                                 (different lengths), then one-token steps in lock step, each
                                 answer vs the sequence's own ONNX Runtime run
  endpoint URL NAME MODEL.onnx   the load and fault test of a static-state repository: many
                                 sequences, abandoned ones, a server restart (RESTART on
                                 stdout, the new URL on stdin)
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
    batches = s.get("batch_stats", [])
    return {
        "inference_count": int(s.get("inference_count", 0)),
        "execution_count": int(s.get("execution_count", 0)),
        "batch_sizes": sorted(int(b["batch_size"]) for b in batches),
        # Summed over requests (time queued) and over executions (time computing).
        "queue_ns": int(s.get("inference_stats", {}).get("queue", {}).get("ns", 0)),
        "compute_ns": sum(int(b.get("compute_infer", {}).get("ns", 0)) for b in batches),
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


def static_reference(sess, pasts, ids):
    """Logits of one ONNX Runtime run of a static-state file on the token list `ids`
    [1, T] from position 0 and zero state: what every request of that sequence must get."""
    feeds = {"input_ids": ids, "position": np.zeros([1], dtype=np.int64)}
    for n, t, d in pasts:
        feeds[n] = np.zeros([1] + d[1:], dtype=t)
    return sess.run(["logits"], feeds)[0]


def run_static(args):
    """A static-state model (docs/static-state.md) served with its position kept by Triton:
    `args.sequences` sequences with prompts of different lengths, sent concurrently; then
    `args.steps` one-token requests per sequence, all sequences in lock step so that
    Triton's sequence batcher can put them in one execution. Requests carry `input_ids`
    only. Each answer must equal the matching rows of one ONNX Runtime run of the built
    file on the sequence's whole token list from position 0 and zero state. Then one
    request that also sends `position`, whose refusal is reported."""
    inputs, outputs = onnx_io(args.model)
    pasts = [(n, t, d) for n, t, d in inputs if n.startswith("past_")]
    sess = session(args.model)
    rng = np.random.default_rng(args.seed)
    lengths = [args.prompt_min + k for k in range(args.sequences)]
    sequences = [rng.integers(0, args.int_high, size=(1, n + args.steps)).astype(np.int64)
                 for n in lengths]
    expected = [static_reference(sess, pasts, ids) for ids in sequences]
    worst = [0.0] * len(sequences)
    errors = []
    barrier = threading.Barrier(args.sequences)
    before = statistics(args.url, args.name)

    def sequence_thread(k):
        try:
            client = http_client(args.url)
            n = lengths[k]
            barrier.wait(timeout=120)
            got = infer(client, args.name, {"input_ids": sequences[k][:, :n]},
                        ["logits"], sequence_id=2000 + k, sequence_start=True)["logits"]
            worst[k] = rel(got[0], expected[k][0, :n])
            for t in range(args.steps):
                barrier.wait(timeout=120)
                p = n + t
                got = infer(client, args.name, {"input_ids": sequences[k][:, p:p + 1]},
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
    # A client that still counts: `position` beside `input_ids` on a sequence's first request.
    position_refused = None
    try:
        infer(http_client(args.url), args.name,
              {"input_ids": sequences[0][:, :2], "position": np.array([[0]], dtype=np.int64)},
              ["logits"], sequence_id=2999, sequence_start=True, sequence_end=True)
    except Exception as e:
        position_refused = str(e)
    print(json.dumps({
        "sequences": args.sequences,
        "prompt_lengths": lengths,
        "steps": args.steps,
        "errors": errors,
        "max_rel": max(worst),
        "inference_count": after["inference_count"] - before["inference_count"],
        "execution_count": after["execution_count"] - before["execution_count"],
        "batch_sizes": after["batch_sizes"],
        "position_refused": position_refused,
    }))


START_FLAG_ERROR = "must specify the START flag"


class Lost(Exception):
    """Triton answered that it does not know the sequence: freed after its idle time, or
    started on a server that has since restarted."""


class Endpoint:
    """Where the requests go, and the restart the Rust test performs on request: a request
    that fails in transport is retried on the new server only once a restart was asked for."""

    def __init__(self, url, name):
        self.url = url
        self.name = name
        self.restart_requested = threading.Event()
        self.restarted = threading.Event()

    def restart(self):
        """Asks the Rust test (stdout) to kill and restart the server; waits for its new URL
        (stdin)."""
        self.restart_requested.set()
        print("RESTART", flush=True)
        line = sys.stdin.readline().strip()
        if not line:
            raise RuntimeError("no URL after RESTART")
        self.url = line
        self.restarted.set()


class Sequence:
    """One generation: a prompt, then `steps` one-token requests of greedy decoding."""

    def __init__(self, sid, prompt, steps):
        self.sid = sid
        self.prompt = prompt
        self.steps = steps
        self.tokens = []       # every token sent, in order
        self.answers = []      # (row of the request's first token, logits [T, vocab])
        self.status = "new"    # completed | abandoned | lost | error
        self.message = None    # Triton's answer when lost, the exception on error
        self.latencies = []
        self.first_answer = None
        self.client = None


def request(ep, seq, ids, start, end):
    """One request of `seq`; Lost when Triton no longer knows the sequence. A transport
    failure while a restart is under way waits for the new server and sends again."""
    from tritonclient.utils import InferenceServerException

    t0 = time.perf_counter()
    while True:
        try:
            if seq.client is None:
                seq.client = http_client(ep.url)
            out = infer(seq.client, ep.name, {"input_ids": ids}, ["logits"],
                        sequence_id=seq.sid, sequence_start=start, sequence_end=end)["logits"]
            seq.latencies.append(time.perf_counter() - t0)
            return out
        except InferenceServerException as e:
            if START_FLAG_ERROR in str(e):
                raise Lost(str(e)) from None
            raise
        except Exception:
            if not ep.restart_requested.is_set():
                raise
            if not ep.restarted.wait(timeout=300):
                raise TimeoutError("the server was not restarted within 300 s") from None
            seq.client = None
            t0 = time.perf_counter()


def decode(ep, seq, hold=None):
    """The prompt with the start flag, then `seq.steps` one-token requests, each sending the
    argmax of the previous answer's last row; the end flag on the last. `hold(seq, step)`
    runs before step `step` (1-based) is sent: it may wait, or return False to abandon the
    sequence (no end flag)."""
    ids = seq.prompt[None, :]
    step = 0
    try:
        while True:
            logits = request(ep, seq, ids, start=(step == 0), end=(step == seq.steps))
            seq.answers.append((len(seq.tokens), logits[0]))
            seq.tokens.extend(int(t) for t in ids[0])
            if step == 0:
                seq.first_answer = time.monotonic()
            if step == seq.steps:
                seq.status = "completed"
                return
            step += 1
            if hold is not None and hold(seq, step) is False:
                seq.status = "abandoned"
                return
            ids = np.array([[int(np.argmax(logits[0, -1]))]], dtype=np.int64)
    except Lost as e:
        seq.status = "lost"
        seq.message = str(e)
    except Exception as e:
        seq.status = "error"
        seq.message = f"{type(e).__name__}: {e}"


def run_wave(ep, seqs, hold=None, timeout=300):
    """Decodes every sequence of `seqs` at once, one thread each; returns the seconds taken."""
    threads = [threading.Thread(target=decode, args=(ep, s, hold), daemon=True) for s in seqs]
    start = time.perf_counter()
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t, s in zip(threads, seqs):
        t.join(timeout=max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            s.status = "error"
            s.message = f"still running after {timeout} s"
    return time.perf_counter() - start


def run_endpoint(args):
    """The load and fault test of a static-state repository (docs/serving.md, "Load and
    faults"), requests carrying `input_ids` only:
      A. `sequences` concurrent sequences, prompts of 1..prompt_max tokens, each decoding
         `steps` tokens one request at a time; a quarter stop mid-way without the end flag.
      B. as many new sequences at once, after half the idle time: all of them must hold a
         slot together (each waits before its last request until all have had a first
         answer), which needs the slots of A's abandoned sequences back; then every
         abandoned sequence's next request must be refused by Triton as unknown.
      C. 16 sequences decode; at step 8 the Rust test kills and restarts the server (stdout
         RESTART, the new URL on stdin) while half of them keep sending: after the restart,
         each request of these sequences must fail with Triton's own error.
      D. 16 new sequences on the restarted server, reusing C's ids: all complete.
      E. a sequence started again (start flag) on its own id after 4 steps, no end flag:
         the new one starts from position 0 and zero state.
    Every answer of every sequence is compared with one ONNX Runtime run of the built file
    on the tokens that sequence sent."""
    inputs, _ = onnx_io(args.model)
    pasts = [(n, t, d) for n, t, d in inputs if n.startswith("past_")]
    sess = session(args.model)
    rng = np.random.default_rng(args.seed)
    ep = Endpoint(args.url, args.name)
    wall = time.perf_counter()

    def new_sequences(first_id, count):
        return [Sequence(first_id + k,
                         rng.integers(0, args.int_high, size=1 + (7 * k) % args.prompt_max).astype(np.int64),
                         args.steps)
                for k in range(count)]

    # A: a quarter abandoned at steps 8..23.
    first_stats = statistics(ep.url, ep.name)
    wave_a = new_sequences(1000, args.sequences)
    abandon_at = {s.sid: 8 + (5 * k) % 16 for k, s in enumerate(wave_a) if k % 4 == 3}
    seconds_a = run_wave(ep, wave_a, lambda s, step: abandon_at.get(s.sid) != step)
    abandoned_until = time.monotonic()

    # B: all at once, holding their slots until every one has been answered once.
    time.sleep(args.idle_s / 2)
    wave_b = new_sequences(2000, args.sequences)
    lock = threading.Lock()
    answered = [0]
    everyone = threading.Event()
    hold_limit = args.idle_s * 3 + 60

    def hold_b(seq, step):
        if step == 1:
            with lock:
                answered[0] += 1
                if answered[0] == len(wave_b):
                    everyone.set()
        if step == seq.steps and not everyone.wait(timeout=hold_limit):
            raise TimeoutError(f"only {answered[0]} of {len(wave_b)} sequences had a slot after {hold_limit} s")
        return True

    started_b = time.monotonic()
    seconds_b = run_wave(ep, wave_b, hold_b)
    firsts = sorted(s.first_answer - started_b for s in wave_b if s.first_answer is not None)
    # The abandoned sequences are unknown now: their next request gets Triton's refusal.
    forgotten = 0
    probe_messages = []
    for s in wave_a:
        if s.status != "abandoned":
            continue
        s.client = None  # tritonclient.http's client belongs to the thread that made it
        try:
            request(ep, s, np.array([[0]], dtype=np.int64), start=False, end=True)
            probe_messages.append(f"sequence {s.sid} still served after its idle time")
        except Lost as e:
            forgotten += 1
            probe_messages.append(str(e))
        except Exception as e:
            probe_messages.append(f"{type(e).__name__}: {e}")
    ab_answers = sum(len(s.answers) for s in wave_a + wave_b)
    ab_stats = statistics_after(ep.url, ep.name, first_stats, ab_answers)

    # C: the server restarted under load.
    wave_c = new_sequences(3000, 16)
    paused = {s.sid for k, s in enumerate(wave_c) if k % 2 == 0}
    kill_point = threading.Barrier(len(wave_c) + 1)

    def hold_c(seq, step):
        if step == 8:
            kill_point.wait(timeout=120)
            if seq.sid in paused:
                ep.restarted.wait(timeout=300)
        return True

    wave_c_thread = threading.Thread(target=run_wave, args=(ep, wave_c, hold_c), daemon=True)
    wave_c_thread.start()
    kill_point.wait(timeout=180)
    ep.restart()
    wave_c_thread.join(timeout=360)

    # D: new sequences on the restarted server, reusing C's ids with the start flag.
    second_stats = statistics(ep.url, ep.name)
    wave_d = new_sequences(3000, 16)
    seconds_d = run_wave(ep, wave_d)
    d_stats = statistics_after(ep.url, ep.name, second_stats, sum(len(s.answers) for s in wave_d))

    # E: a start flag on a sequence id in flight begins a new sequence from position 0 and
    # zero state (the old one is ended): 4 steps, then the same id started again.
    first_try, again = new_sequences(4000, 2)
    again.sid = first_try.sid
    run_wave(ep, [first_try], lambda s, step: step <= 4)
    run_wave(ep, [again])

    # Every answer against its sequence's own whole run of the built file.
    worst = {"completed": 0.0, "other": 0.0}
    for s in wave_a + wave_b + wave_c + wave_d + [first_try, again]:
        if not s.answers:
            continue
        expected = static_reference(sess, pasts, np.array([s.tokens], dtype=np.int64))
        r = max(rel(got, expected[0, row:row + got.shape[0]]) for row, got in s.answers)
        key = "completed" if s.status == "completed" else "other"
        worst[key] = max(worst[key], r)

    def count(wave, status):
        return sum(s.status == status for s in wave)

    all_seqs = wave_a + wave_b + wave_c + wave_d + [first_try, again]
    latencies = np.array([x for s in all_seqs for x in s.latencies])
    print(json.dumps({
        "errors": [f"sequence {s.sid}: {s.message}" for s in all_seqs if s.status == "error"],
        "max_rel_completed": worst["completed"],
        "max_rel_other": worst["other"],
        "prompt_lengths": sorted({int(s.prompt.size) for s in wave_a}),
        "steps": args.steps,
        "a": {"sequences": len(wave_a), "completed": count(wave_a, "completed"),
              "abandoned": count(wave_a, "abandoned"), "seconds": round(seconds_a, 2)},
        "b": {"sequences": len(wave_b), "completed": count(wave_b, "completed"),
              "lost": count(wave_b, "lost"), "seconds": round(seconds_b, 2),
              "after_abandonment_s": round(started_b - abandoned_until, 2),
              "last_first_answer_s": round(firsts[-1], 2) if firsts else None,
              "median_first_answer_s": round(firsts[len(firsts) // 2], 2) if firsts else None},
        "abandoned_forgotten": forgotten,
        "probe_messages": probe_messages[:2] + [m for m in probe_messages if START_FLAG_ERROR not in m],
        "a_b_answers": ab_answers,
        "a_b_inference_count": ab_stats["inference_count"] - first_stats["inference_count"],
        "a_b_execution_count": ab_stats["execution_count"] - first_stats["execution_count"],
        "a_b_batch_sizes": ab_stats["batch_sizes"],
        "c": {"sequences": len(wave_c), "paused": len(paused),
              "paused_lost": sum(s.status == "lost" for s in wave_c if s.sid in paused),
              "running_lost": sum(s.status == "lost" for s in wave_c if s.sid not in paused),
              "running_completed": sum(s.status == "completed" for s in wave_c if s.sid not in paused),
              "lost_messages": sorted({s.message for s in wave_c if s.status == "lost"}),
              "answers_before_restart": sum(len(s.answers) for s in wave_c)},
        "d": {"sequences": len(wave_d), "completed": count(wave_d, "completed"),
              "seconds": round(seconds_d, 2),
              "inference_count": d_stats["inference_count"] - second_stats["inference_count"],
              "execution_count": d_stats["execution_count"] - second_stats["execution_count"]},
        "e": {"first_try": first_try.status, "answers_before_start_again": len(first_try.answers),
              "again": again.status},
        "requests": int(latencies.size),
        "latency_p50_ms": float(np.percentile(latencies, 50)) * 1e3,
        "latency_p99_ms": float(np.percentile(latencies, 99)) * 1e3,
        "seconds": round(time.perf_counter() - wall, 2),
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
    for name in ("stateless", "with-past", "static", "endpoint"):
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
        if name == "endpoint":
            s.add_argument("--prompt-max", type=int, default=16,
                           help="prompts of 1 to this many tokens")
            s.add_argument("--idle-s", type=float, required=True,
                           help="the repository's max_sequence_idle_microseconds, in seconds")
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
    elif args.command == "endpoint":
        run_endpoint(args)
    else:
        print(json.dumps(statistics(args.url, args.name)))


if __name__ == "__main__":
    sys.exit(main())
