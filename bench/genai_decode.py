"""onnxruntime-genai's step next to `gmlp-onnx generate`'s on the same model (BENCHMARKS.md,
"onnxruntime-genai"): amlp-base --layers 6 --causal --with-past (n = 512), its genai folder
written by `build --genai-dir`, a prompt of 448 tokens and 64 greedy tokens.

Ours is `generate --json`'s median step (feed the last token, run, pick) on the built file;
genai's is the median of `generate_next_token()` + `get_next_tokens()` after the first
(the same per-token work: run the step, pick, hand the token to the caller) on the folder.
Rounds alternate between the two (machines are shared and noisy) and the tokens must be
equal. Prints one JSON object; `--device cuda` uses onnxruntime-genai-cuda and
`generate --runtime ort-cuda` (genai with and without its CUDA graph).

On the CPU it also times the two graphs alone, apart from both loops: the folder's
model.onnx and the built file in ONNX Runtime (Python), each step's state bound in place
(I/O binding, as both loops do), the steps of the two sessions interleaved in one process
so that load changes hit both alike (`graphs_*`: is the folder's graph as fast as the file?).

Usage: python3 bench/genai_decode.py BIN OUT_DIR [--device cpu|cuda] [--rounds 3] [--threads N]
  BIN: a gmlp-onnx release binary; ORT_DYLIB_PATH must name the ONNX Runtime library both use
  (genai reads ORT_LIB_PATH, set here from it).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = [(i * 7919) % 32000 for i in range(448)]
NEW = 64


def build(binary, out):
    model, folder = os.path.join(out, "static.onnx"), os.path.join(out, "genai")
    if not os.path.exists(os.path.join(folder, "genai_config.json")):
        subprocess.run([binary, "build", "--preset", "amlp-base", "--layers", "6", "--causal",
                        "--with-past", "-o", model, "--genai-dir", folder, "-q"], check=True,
                       stdout=sys.stderr)  # stdout is this script's JSON
    return model, folder


def ours(binary, model, runtime, threads):
    out = subprocess.run([binary, "generate", model, "--prompt-ids", ",".join(map(str, PROMPT)),
                          "--max-new-tokens", str(NEW), "--runtime", runtime, "--json", "-q",
                          "--threads", str(threads)],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)[0]
    return r["step_median_ms"], r["tokens"], r.get("note")


def genai(folder, device, graph, threads):
    import onnxruntime_genai as og

    if threads:
        # genai reads its session options from the folder's config only: a sibling folder
        # with the same model.onnx and the thread count in the config (0: as written).
        pinned = f"{folder}-threads{threads}"
        os.makedirs(pinned, exist_ok=True)
        for name in os.listdir(folder):
            if name != "genai_config.json" and not os.path.exists(os.path.join(pinned, name)):
                os.symlink(os.path.abspath(os.path.join(folder, name)), os.path.join(pinned, name))
        c = json.load(open(os.path.join(folder, "genai_config.json")))
        c["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
        json.dump(c, open(os.path.join(pinned, "genai_config.json"), "w"), indent=2)
        folder = pinned
    config = og.Config(folder)
    if device == "cuda":
        config.clear_providers()
        config.append_provider("cuda")
        if graph:
            config.set_provider_option("cuda", "enable_cuda_graph", "1")
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + NEW, do_sample=False)
    g = og.Generator(model, params)
    g.append_tokens([PROMPT])
    tokens, steps = [], []
    while not g.is_done():
        t0 = time.perf_counter()
        g.generate_next_token()
        tokens.append(int(g.get_next_tokens()[0]))
        steps.append((time.perf_counter() - t0) * 1e3)
    # The first pick reads the prompt's logits; the steps after it each run the model.
    return statistics.median(steps[1:]), tokens


def graphs(model, folder, threads, steps=60):
    """Median step of the built file and of the folder's model.onnx in ONNX Runtime, the two
    sessions' steps interleaved; the greedy tokens must agree at every step."""
    import numpy as np
    import onnxruntime as ort

    def session(path, genai_names):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        b, state = s.io_binding(), {}
        for i in s.get_inputs():
            if i.name.startswith("past"):
                shape = [d if isinstance(d, int) else 1 for d in i.shape]
                state[i.name] = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
                b.bind_ortvalue_input(i.name, state[i.name])

        def past_of(present):
            if genai_names:
                return present.replace("present.", "past_key_values.")
            return present.replace("present_", "past_")

        def run(ids, pos):
            b.bind_cpu_input("input_ids", np.array([ids], np.int64))
            if genai_names:
                b.bind_cpu_input("position_ids", np.arange(pos, pos + len(ids), dtype=np.int64)[None])
                b.bind_cpu_input("attention_mask", np.ones((1, pos + len(ids)), np.int64))
            else:
                b.bind_cpu_input("position", np.array([pos], np.int64))
            b.clear_binding_outputs()
            b.bind_output("logits", "cpu")  # first: copy_outputs_to_cpu()[0]
            for o in s.get_outputs():
                if o.name.startswith("present"):
                    b.bind_ortvalue_output(o.name, state[past_of(o.name)])
            s.run_with_iobinding(b)
            return b.get_outputs()[0].numpy()  # the logits only (the states stay in place)
        return run

    built, theirs = session(model, False), session(os.path.join(folder, "model.onnx"), True)
    lb, lf = built(PROMPT, 0), theirs(PROMPT, 0)
    tb, tf, pos = [], [], len(PROMPT)
    for _ in range(steps):
        vocab = lb.shape[-1]
        t1, t2 = int(lb[0, -1].argmax()), int(lf[0, -1, :vocab].argmax())
        if t1 != t2:
            raise SystemExit(f"graphs: tokens differ at position {pos}: {t1} vs {t2}")
        t0 = time.perf_counter()
        lb = built([t1], pos)
        t_mid = time.perf_counter()
        lf = theirs([t2], pos)
        tf.append((time.perf_counter() - t_mid) * 1e3)
        tb.append((t_mid - t0) * 1e3)
        pos += 1
    return statistics.median(tb), statistics.median(tf)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("out")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads of every session (0: ONNX Runtime's default)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.environ.setdefault("ORT_LIB_PATH", os.environ.get("ORT_DYLIB_PATH", ""))
    model, folder = build(a.binary, a.out)
    runtime = "ort-cuda" if a.device == "cuda" else "ort-cpu"
    variants = [("genai", False)] + ([("genai_cuda_graph", True)] if a.device == "cuda" else [])
    times = {"gmlp_onnx": []}
    times.update({name: [] for name, _ in variants})
    result = {"device": a.device, "prompt": len(PROMPT), "new_tokens": NEW, "threads": a.threads}
    for _ in range(a.rounds):
        ms, ours_tokens, note = ours(a.binary, model, runtime, a.threads)
        times["gmlp_onnx"].append(ms)
        result["gmlp_onnx_note"] = note
        for name, graph in variants:
            try:
                ms, their_tokens = genai(folder, a.device, graph, a.threads)
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                result[f"{name}_error"] = str(e)
                continue
            times[name].append(ms)
            result[f"{name}_tokens_equal"] = their_tokens == ours_tokens
    for name, ts in times.items():
        if ts:
            result[f"{name}_step_ms"] = statistics.median(ts)
            result[f"{name}_rounds_ms"] = ts
    for name, _ in variants:
        if f"{name}_step_ms" in result:
            result[f"{name}_over_ours"] = result[f"{name}_step_ms"] / result["gmlp_onnx_step_ms"]
    if a.device == "cpu":
        built_ms, folder_ms = graphs(model, folder, a.threads)
        result["graphs_built_file_step_ms"] = built_ms
        result["graphs_folder_step_ms"] = folder_ms
        result["graphs_folder_over_built_file"] = folder_ms / built_ms
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
