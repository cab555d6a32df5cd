"""onnxruntime-genai's step next to `gmlp-onnx generate`'s on the same model (BENCHMARKS.md,
"onnxruntime-genai"): amlp-base --layers 6 --causal --with-past (n = 512), its genai folder
written by `build --genai-dir`, a prompt of 448 tokens and 64 greedy tokens.

Ours is `generate --json`'s median step (feed the last token, run, pick) on the built file;
genai's is the median of `generate_next_token()` + `get_next_tokens()` after the first
(the same per-token work: run the step, pick, hand the token to the caller) on the folder.
Rounds alternate between the two (machines are shared and noisy) and the tokens must be
equal. Prints one JSON object; `--device cuda` uses onnxruntime-genai-cuda and
`generate --runtime ort-cuda` (genai with and without its CUDA graph).

Usage: python3 bench/genai_decode.py BIN OUT_DIR [--device cpu|cuda] [--rounds 3]
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


def ours(binary, model, runtime):
    out = subprocess.run([binary, "generate", model, "--prompt-ids", ",".join(map(str, PROMPT)),
                          "--max-new-tokens", str(NEW), "--runtime", runtime, "--json", "-q"],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)[0]
    return r["step_median_ms"], r["tokens"], r.get("note")


def genai(folder, device, graph):
    import onnxruntime_genai as og

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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("out")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.environ.setdefault("ORT_LIB_PATH", os.environ.get("ORT_DYLIB_PATH", ""))
    model, folder = build(a.binary, a.out)
    runtime = "ort-cuda" if a.device == "cuda" else "ort-cpu"
    variants = [("genai", False)] + ([("genai_cuda_graph", True)] if a.device == "cuda" else [])
    times = {"gmlp_onnx": []}
    times.update({name: [] for name, _ in variants})
    result = {"device": a.device, "prompt": len(PROMPT), "new_tokens": NEW}
    for _ in range(a.rounds):
        ms, ours_tokens, note = ours(a.binary, model, runtime)
        times["gmlp_onnx"].append(ms)
        result["gmlp_onnx_note"] = note
        for name, graph in variants:
            try:
                ms, their_tokens = genai(folder, a.device, graph)
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
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
