"""ONNX Runtime's own figures for the GPU table of BENCHMARKS.md, measured from Python on the same files
gmlp-onnx runs (bench/gpu_decode.sh calls this and prints both side by side), and the
fixtures' inputs and upstream outputs as .npz for `validate --inputs/--expected`.

  python3 bench/gpu_decode.py ort --whole W.onnx --static S.onnx [--static S2.onnx] \
      --prompt 448 --steps 64 --batches 1,8 > ort.json
  python3 bench/gpu_decode.py fixtures OUT_DIR      # fixtures/*/io.safetensors -> npz, and
                                                    # whole.inputs.npz (the ids `ort` feeds)
  python3 bench/gpu_decode.py summary OUT_DIR       # the table from the JSON files
  python3 bench/gpu_decode.py kernels S.onnx [S2.onnx ...] [--batches 1,8,64] > kernels.json
                                                    # CUDA kernels per step (torch.profiler)
  python3 bench/gpu_decode.py genai-capture GENAI_DIR  # ONNX Runtime alone captures the
                                                    # folder's step as a CUDA graph?

`ort` needs onnxruntime-gpu and numpy; every figure is a median over timed runs after
warm-up runs, with TF32 off (as gmlp-onnx's default), on CUDA device 0:
- whole forward: `input_ids` [1, n] bound on the device, `logits` left on the device, and
  the same with `logits` copied to the host;
- static step: the state bound on the device as both `past_*` and `present_*` (written in
  place), `input_ids` [B, 1] and `position` [B] updated in place on the device, `logits`
  [B, 1, V] bound on the device, after a prompt of `--prompt` tokens; once without and once
  with CUDA graphs (`enable_cuda_graph`, `gpu_graph_id` = B; the prompt runs with -1).
The step here is the run alone (no token pick): gmlp-onnx's step also picks the token (an
ArgMax appended to its copy of the graph, which also advances the position on the device)
and copies the ids back to the host.
"""
import json
import os
import struct
import sys
import time


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def timed(fn, warm, runs):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return median(out)


# GPU_DECODE_DEVICE=cpu runs the same code on the CPU execution provider (a dry run of
# this script on a machine without a GPU; no CUDA graphs there).
DEVICE = os.environ.get("GPU_DECODE_DEVICE", "cuda")


def cuda_providers(graphs):
    if DEVICE == "cpu":
        return ["CPUExecutionProvider"]
    opts = {"use_tf32": "0"}
    if graphs:
        opts["enable_cuda_graph"] = "1"
    return [("CUDAExecutionProvider", opts)]


def whole(ort, np, path):
    sess = ort.InferenceSession(path, providers=cuda_providers(False))
    inp = sess.get_inputs()[0]
    n = inp.shape[1] if isinstance(inp.shape[1], int) else 512
    ids = (np.arange(n, dtype=np.int64) * 7919 % 32000).reshape(1, n)
    ids_dev = ort.OrtValue.ortvalue_from_numpy(ids, DEVICE, 0)
    out = {}
    for where in [DEVICE, "cpu"]:
        b = sess.io_binding()
        b.bind_ortvalue_input(inp.name, ids_dev)
        b.bind_output("logits", where)
        out[f"whole_logits_on_{'device' if where != 'cpu' else 'host'}_ms"] = timed(lambda: sess.run_with_iobinding(b), 5, 30)
    return out


def static_steps(ort, np, path, batch, prompt, steps, graphs):
    sess = ort.InferenceSession(path, providers=cuda_providers(graphs))
    pasts = [i for i in sess.get_inputs() if i.name.startswith("past_")]
    vocab = [o for o in sess.get_outputs() if o.name == "logits"][0].shape[2]
    state = {i.name: ort.OrtValue.ortvalue_from_numpy(
        np.zeros([batch] + i.shape[1:], np.float32), DEVICE, 0) for i in pasts}

    def binding(ids_v, pos_v, logits_v):
        b = sess.io_binding()
        b.bind_ortvalue_input("input_ids", ids_v)
        b.bind_ortvalue_input("position", pos_v)
        for name, v in state.items():
            b.bind_ortvalue_input(name, v)
            b.bind_ortvalue_output(name.replace("past_", "present_", 1), v)
        b.bind_ortvalue_output("logits", logits_v)
        return b

    ids = (np.arange(batch * prompt, dtype=np.int64) * 7919 % vocab).reshape(batch, prompt)
    first = binding(ort.OrtValue.ortvalue_from_numpy(ids, DEVICE, 0),
                    ort.OrtValue.ortvalue_from_numpy(np.zeros([batch], np.int64), DEVICE, 0),
                    ort.OrtValue.ortvalue_from_shape_and_type([batch, prompt, vocab], np.float32, DEVICE, 0))
    ro_prompt = ort.RunOptions()
    ro_step = ort.RunOptions()
    if graphs:
        ro_prompt.add_run_config_entry("gpu_graph_id", "-1")
        ro_step.add_run_config_entry("gpu_graph_id", str(batch))
    sess.run_with_iobinding(first, ro_prompt)
    step_ids = ort.OrtValue.ortvalue_from_numpy(np.ones([batch, 1], np.int64), DEVICE, 0)
    position = ort.OrtValue.ortvalue_from_numpy(np.full([batch], prompt, np.int64), DEVICE, 0)
    logits = ort.OrtValue.ortvalue_from_shape_and_type([batch, 1, vocab], np.float32, DEVICE, 0)
    b = binding(step_ids, position, logits)
    pos = [prompt]

    def step():
        # One fixed position keeps the step identical for replay; the rows it rewrites are
        # the same every time (the cost does not depend on P: the state is read whole).
        sess.run_with_iobinding(b, ro_step)

    ms = timed(step, 5, steps)
    del pos
    return ms


def kernels_main(args):
    """CUDA kernels a static step launches: torch.profiler's CUDA kernel events (CUPTI) around
    `runs` steps of each file (state in place on the device, no CUDA graph, so that each
    kernel is its own launch), divided by the runs; per batch."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from torch.profiler import ProfilerActivity, profile

    ort.set_default_logger_severity(3)
    paths = [a for a in args if not a.startswith("--") and a.endswith(".onnx")]
    batches = [1, 8, 64]
    if "--batches" in args:
        batches = [int(x) for x in args[args.index("--batches") + 1].split(",")]
    runs, out = 20, {"torch": torch.__version__, "onnxruntime": ort.__version__}
    for path in paths:
        tag = os.path.basename(path).removesuffix(".onnx")
        for b in batches:
            try:
                sess = ort.InferenceSession(path, providers=cuda_providers(False))
                pasts = [i for i in sess.get_inputs() if i.name.startswith("past_")]
                vocab = [o for o in sess.get_outputs() if o.name == "logits"][0].shape[2]
                bind = sess.io_binding()
                state = [ort.OrtValue.ortvalue_from_numpy(np.zeros([b] + i.shape[1:], np.float32), DEVICE, 0)
                         for i in pasts]
                for i, v in zip(pasts, state):
                    bind.bind_ortvalue_input(i.name, v)
                    bind.bind_ortvalue_output(i.name.replace("past_", "present_", 1), v)
                bind.bind_ortvalue_input("input_ids", ort.OrtValue.ortvalue_from_numpy(np.ones([b, 1], np.int64), DEVICE, 0))
                bind.bind_ortvalue_input("position", ort.OrtValue.ortvalue_from_numpy(np.full([b], 448, np.int64), DEVICE, 0))
                bind.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_shape_and_type([b, 1, vocab], np.float32, DEVICE, 0))
                for _ in range(5):
                    sess.run_with_iobinding(bind)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(runs):
                        sess.run_with_iobinding(bind)
                    torch.cuda.synchronize()
                kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                           and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
                out[f"{tag}_b{b}_kernels_per_step"] = len(kernels) / runs
                out[f"{tag}_b{b}_memcpy_per_step"] = sum(
                    "memcpy" in e.name.lower() for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CUDA) / runs
            except Exception as e:
                out[f"{tag}_b{b}_kernels_error"] = str(e).splitlines()[0][:300]
    print(json.dumps(out, indent=1))


def genai_capture_main(args):
    """Whether ONNX Runtime alone captures a CUDA graph of a genai folder's model.onnx, fed
    as genai feeds it (input_ids [B, 1], position_ids [B, 1], attention_mask [B, n], the
    shared past/present buffers, all on the device): the capture's result or error, and
    ONNX Runtime's own words on node placement (warnings and above), which name a node it
    put on the CPU. Tells a graph problem (this fails) from one of genai's loop (this works
    while genai's capture fails)."""
    import numpy as np
    import onnxruntime as ort

    folder, batch = args[0], 1
    path = os.path.join(folder, "model.onnx")
    so = ort.SessionOptions()
    so.log_severity_level = 1
    out = {}
    try:
        sess = ort.InferenceSession(path, so, providers=cuda_providers(True))
        names = [i.name for i in sess.get_inputs()]
        n = max((i.shape[2] for i in sess.get_inputs() if i.name.startswith("past_")), default=512)
        dev = lambda a: ort.OrtValue.ortvalue_from_numpy(a, DEVICE, 0)
        bind = sess.io_binding()
        for i in sess.get_inputs():
            if i.name.startswith("past_"):
                v = dev(np.zeros([batch] + i.shape[1:], np.float32))
                bind.bind_ortvalue_input(i.name, v)
                present = i.name.replace("past_key_values.", "present.")
                bind.bind_ortvalue_output(present, v)
        bind.bind_ortvalue_input("input_ids", dev(np.ones([batch, 1], np.int64)))
        bind.bind_ortvalue_input("position_ids", dev(np.full([batch, 1], 3, np.int64)))
        if "attention_mask" in names:
            bind.bind_ortvalue_input("attention_mask", dev(np.ones([batch, n], np.int64)))
        vocab = [o for o in sess.get_outputs() if o.name == "logits"][0].shape[-1]
        bind.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_shape_and_type([batch, 1, vocab], np.float32, DEVICE, 0))
        ro = ort.RunOptions()
        ro.add_run_config_entry("gpu_graph_id", "1")
        for _ in range(4):  # warm-up, capture, replays
            sess.run_with_iobinding(bind, ro)
        out["captured"] = True
        out["replay_ms"] = timed(lambda: sess.run_with_iobinding(bind, ro), 3, 30)
    except Exception as e:
        out["captured"] = False
        out["error"] = str(e)[:2000]
    print(json.dumps(out, indent=1))


def ort_main(args):
    import numpy as np
    import onnxruntime as ort
    ort.set_default_logger_severity(3)
    opts = {"prompt": 448, "steps": 64, "batches": "1,8", "static": []}
    k = 0
    while k < len(args):
        key = args[k].lstrip("-")
        if key == "static":
            opts["static"].append(args[k + 1])
        else:
            opts[key] = args[k + 1]
        k += 2
    out = {"onnxruntime": ort.__version__, "device": ort.get_device()}
    try:
        out.update(whole(ort, np, opts["whole"]))
    except Exception as e:  # each figure on its own
        out["whole_error"] = str(e).splitlines()[0][:300]
    for path in opts["static"]:
        tag = os.path.basename(path).removesuffix(".onnx")
        for b in [int(x) for x in str(opts["batches"]).split(",")]:
            for graphs in [False, True] if DEVICE == "cuda" else [False]:
                key = f"{tag}_b{b}_{'graph' if graphs else 'nograph'}_step_ms"
                try:
                    out[key] = static_steps(ort, np, path, b, int(opts["prompt"]), int(opts["steps"]), graphs)
                except Exception as e:
                    out[key + "_error"] = str(e).splitlines()[0][:300]
    print(json.dumps(out, indent=1))


def read_safetensors(path):
    import numpy as np
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    types = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], types[t["dtype"]]).reshape(t["shape"])
    return out


def fixtures_main(args):
    """Each fixture's model input and upstream output as NAME.inputs.npz / .expected.npz,
    with its build flags and (g-mlp-gpt) greedy prompt and tokens in fixtures.json."""
    import numpy as np
    out_dir = args[0]
    os.makedirs(out_dir, exist_ok=True)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
    listing = {}
    for name in sorted(os.listdir(root)):
        meta_path = os.path.join(root, name, "meta.json")
        if not os.path.exists(meta_path):
            continue
        meta = json.load(open(meta_path))
        io = read_safetensors(os.path.join(root, name, "io.safetensors"))
        inp = meta.get("input_name", "input_ids")
        output = "last_hidden_state" if inp == "inputs_embeds" else "logits"
        np.savez(os.path.join(out_dir, f"{name}.inputs.npz"), **{inp: io[inp]})
        np.savez(os.path.join(out_dir, f"{name}.expected.npz"), **{output: io[output]})
        entry = {"flags": meta["flags"], "input": inp}
        if "greedy_prompt" in io:
            entry["greedy_prompt"] = io["greedy_prompt"][0].tolist()
            entry["greedy_tokens"] = io["greedy_tokens"][0].tolist()
        listing[name] = entry
    json.dump(listing, open(os.path.join(out_dir, "fixtures.json"), "w"), indent=1)
    # The whole forward's input: the ids `ort` feeds (amlp-base, n = 512).
    ids = (np.arange(512, dtype=np.int64) * 7919 % 32000).reshape(1, 512)
    np.savez(os.path.join(out_dir, "whole.inputs.npz"), input_ids=ids)


def summary_main(args):
    d = args[0]
    load = lambda f: json.load(open(os.path.join(d, f))) if os.path.exists(os.path.join(d, f)) else {}
    ort_ = load("ort.json")
    ours = load("ours.json")
    rows = [
        ("whole forward, logits left on the device", ort_.get("whole_logits_on_device_ms"), ours.get("validate_device_ms")),
        ("whole forward, logits to the host", ort_.get("whole_logits_on_host_ms"), ours.get("validate_host_ms")),
    ]
    for tag in ["static24", "static17"]:
        for b in [1, 8]:
            rows.append((f"{tag} step, batch {b}, no graph", ort_.get(f"{tag}_b{b}_nograph_step_ms"), None))
            rows.append((f"{tag} step, batch {b}, CUDA graph (ours: generate)", ort_.get(f"{tag}_b{b}_graph_step_ms"),
                         ours.get(f"{tag}_b{b}_step_ms")))
    print(f"{'what':58} {'ORT (Python)':>14} {'gmlp-onnx':>12}")
    fmt = lambda v: "-" if v is None else f"{v:.3f} ms"
    for what, a, b in rows:
        print(f"{what:58} {fmt(a):>14} {fmt(b):>12}")
    for tag in ["static24", "static17"]:
        t, m = ours.get(f"{tag}_b8_tokens_per_s"), ours.get(f"{tag}_b8_median_tokens_per_s")
        if t and m:
            print(f"{tag} batch 8: gmlp-onnx {m:.0f} tokens/s at the median step, {t:.0f} over all 63 steps (warm-up and capture included)")
    # The GPU goals of BENCHMARKS.md ("Generation on the GPU"), on the ort-gpu file (static24),
    # at the median step.
    step1, tps8 = ours.get("static24_b1_step_ms"), ours.get("static24_b8_median_tokens_per_s")
    if step1 is not None:
        print(f"goal static24 batch-1 step <= 0.5 ms: {step1:.3f} ms, {'met' if step1 <= 0.5 else 'MISSED'}")
    if tps8 is not None:
        print(f"goal static24 batch-8 >= 9,000 tokens/s: {tps8:.0f}, {'met' if tps8 >= 9000 else 'MISSED'}")
    dev, py = ours.get("validate_device_ms"), ort_.get("whole_logits_on_device_ms")
    if dev is not None and py:
        print(f"goal whole forward on the device <= 1.1x ONNX Runtime's: {dev / py:.2f}x, {'met' if dev <= 1.1 * py else 'MISSED'}")
    for k, v in ours.items():
        # What generate said it did (e.g. "CUDA graphs off: ..." when ONNX Runtime refused them).
        if k.endswith("_note") or k.endswith("_error"):
            print(f"{k}: {v}")
    for k, v in ours.items():
        if k.startswith("check_"):
            print(f"{k}: {v}")
    for k, v in ort_.items():
        if k.endswith("_error"):
            print(f"ORT {k}: {v}")
    genai = load("genai.json")
    if genai:
        ours_ms = genai.get("gmlp_onnx_step_ms")
        for name in ["genai", "genai_cuda_graph"]:
            ms = genai.get(f"{name}_step_ms")
            if ms is not None and ours_ms:
                print(f"onnxruntime-genai ({name}) step, batch 1, static17 folder: {ms:.3f} ms vs gmlp-onnx "
                      f"{ours_ms:.3f} ms ({ms / ours_ms:.2f}x); tokens equal: {genai.get(name + '_tokens_equal')}")
            if genai.get(f"{name}_error"):
                print(f"genai {name}_error: {genai[name + '_error']}")


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    {"ort": ort_main, "fixtures": fixtures_main, "summary": summary_main, "kernels": kernels_main,
     "genai-capture": genai_capture_main}[cmd](rest)
