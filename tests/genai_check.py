"""Checks of an onnxruntime-genai folder written by `gmlp-onnx genai`, for tests/suite/genai.rs.

Each subcommand prints one JSON object on stdout.

  tokens FOLDER PROMPTS NEW   genai's greedy tokens (og.Generator, CPU): each prompt alone
                              (max_length = its length + NEW, or n with NEW = 0) and the
                              prompts as one right-padded batch; PROMPTS is "1,2,3;4,5".
  state FOLDER BUILT PROMPT [TRITON_MODEL]
                              the folder's model.onnx run by plain ONNX Runtime with genai's
                              inputs (position_ids, attention_mask, rank-4 key/value state
                              shared in place as genai does) against the built file with its
                              own inputs: the greedy tokens and the largest logit difference
                              over the prompt and the steps until n, once with every state
                              buffer zero and once NaN (what genai leaves on a device it does
                              not zero); with TRITON_MODEL (a `gmlp-onnx triton` repository's
                              model.onnx of the same file), also its greedy tokens with the
                              position counter fed back as Triton does.
  text FOLDER TEXT            og.Tokenizer: the ids of TEXT and the text of those ids.
  rewind FOLDER PROMPT        og.Generator.rewind_to: greedy tokens of PROMPT up to n, then
                              for a rewind into the generated tokens and one into the
                              prompt (genai's pattern: rewind_to, append_tokens of the rest,
                              generate), whether the tokens and every step's logits equal
                              the first run's from there on, bit for bit.
"""
import json
import sys

import numpy as np


def parse_prompts(text):
    return [[int(t) for t in p.split(",")] for p in text.split(";")]


def genai_tokens(folder, prompts, new):
    import onnxruntime_genai as og

    model = og.Model(folder)
    config = json.load(open(f"{folder}/genai_config.json"))["model"]
    pad, n = config["pad_token_id"], config["context_length"]

    def run(batch):
        longest = max(map(len, batch))
        params = og.GeneratorParams(model)
        params.set_search_options(
            max_length=longest + new if new else n, do_sample=False, batch_size=len(batch)
        )
        g = og.Generator(model, params)
        g.append_tokens(np.array([p + [pad] * (longest - len(p)) for p in batch], dtype=np.int32))
        out = [[] for _ in batch]
        done = [False] * len(batch)
        while not g.is_done():
            g.generate_next_token()
            for i, t in enumerate(g.get_next_tokens()):
                if not done[i]:
                    out[i].append(int(t))
                    done[i] = int(t) == config["eos_token_id"]
        return out

    return {"single": [run([p])[0] for p in prompts], "batch": run(prompts)}


def state_check(folder, built, prompt, triton=None):
    import onnx
    import onnxruntime as ort

    meta = {p.key: p.value for p in onnx.load(f"{folder}/model.onnx", load_external_data=False).metadata_props}
    layers = json.loads(meta["gmlp_onnx.genai_layers"])
    built_meta = {p.key: p.value for p in onnx.load(built, load_external_data=False).metadata_props}
    decoding = json.loads(built_meta["gmlp_onnx.decoding"])
    n = decoding["max_sequence"]
    so = ort.SessionOptions()
    ours = ort.InferenceSession(built, so, providers=["CPUExecutionProvider"])
    theirs = ort.InferenceSession(f"{folder}/model.onnx", so, providers=["CPUExecutionProvider"])
    widths = {s["past"]: s["width"] for s in decoding["state"]}
    genai_tensors = []  # (past4, present4, width)
    for l in layers:
        for part, past_t, present_t in [("key", "past_key_values.%d.key", "present.%d.key"),
                                        ("value", "past_key_values.%d.value", "present.%d.value")]:
            genai_tensors.append((past_t % l["index"], present_t % l["index"], l["width"]))

    def decode_ours(fill):
        state = {s: np.full((1, n, w), fill, np.float32) for s, w in widths.items()}
        tokens, logits_seen, seq, pos = [], [], list(prompt), 0
        feed_ids = list(prompt)
        while pos + len(feed_ids) <= n:
            feed = {"input_ids": np.array([feed_ids], np.int64), "position": np.array([pos], np.int64)}
            feed.update(state)
            outs = dict(zip([o.name for o in ours.get_outputs()], ours.run(None, feed)))
            for s in widths:
                state[s] = outs["present_" + s[len("past_"):]]
            logits = outs["logits"][0, -1]
            logits_seen.append(outs["logits"][0])
            pos += len(feed_ids)
            t = int(np.argmax(logits))
            tokens.append(t)
            feed_ids = [t]
        return tokens, logits_seen

    def decode_theirs(fill):
        # One buffer per key/value, bound as both past and present (genai's shared buffer).
        buffers = {p: np.full((1, 1, n, w), fill, np.float32) for p, _, w in genai_tensors}
        tokens, logits_seen, pos = [], [], 0
        feed_ids = list(prompt)
        while pos + len(feed_ids) <= n:
            b = theirs.io_binding()
            ids = np.array([feed_ids], np.int64)
            b.bind_cpu_input("input_ids", ids)
            b.bind_cpu_input("position_ids", np.arange(pos, pos + len(feed_ids), dtype=np.int64)[None])
            b.bind_cpu_input("attention_mask", np.ones((1, pos + len(feed_ids)), np.int64))
            for p, q, w in genai_tensors:
                buf = buffers[p]
                b.bind_input(p, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
                b.bind_output(q, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
            b.bind_output("logits", "cpu")
            theirs.run_with_iobinding(b)
            logits = b.get_outputs()[-1].numpy()  # bound last
            logits_seen.append(logits[0])
            pos += len(feed_ids)
            t = int(np.argmax(logits[0, -1]))
            tokens.append(t)
            feed_ids = [t]
        return tokens, logits_seen

    def decode_triton(fill):
        # Triton's implicit states: past_* fed back from present_*, position [batch, 1]
        # from triton_next_position (0 at the sequence's start).
        session = ort.InferenceSession(triton, so, providers=["CPUExecutionProvider"])
        state = {s: np.full((1, n, w), fill, np.float32) for s, w in widths.items()}
        position = np.zeros((1, 1), np.int64)
        tokens, logits_seen, feed_ids = [], [], list(prompt)
        while int(position[0, 0]) + len(feed_ids) <= n:
            feed = {"input_ids": np.array([feed_ids], np.int64), "position": position}
            feed.update(state)
            outs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
            for s in widths:
                state[s] = outs["present_" + s[len("past_"):]]
            position = outs["triton_next_position"]
            logits_seen.append(outs["logits"][0])
            t = int(np.argmax(outs["logits"][0, -1]))
            tokens.append(t)
            feed_ids = [t]
        return tokens, logits_seen

    def largest(pairs):
        # The largest |a - b| over the steps (equal values, the end token's -inf too, differ
        # by 0; None when a difference is not finite, e.g. NaN logits).
        d = max(float(np.max(np.where(x == y[:, : x.shape[1]], 0.0, np.abs(x - y[:, : x.shape[1]]))))
                for x, y in pairs)
        return d if np.isfinite(d) else None

    out, logits = {}, {}
    for name, fill in [("zero", 0.0), ("nan", np.nan)]:
        a, la = decode_ours(fill)
        b, lb = decode_theirs(fill)
        out[name] = {"ours": a, "genai_model": b, "max_abs_logit_diff": largest(zip(la, lb))}
        logits[name] = {"ours": la, "genai_model": lb}
        if triton:
            out[name]["triton_model"], logits[name]["triton_model"] = decode_triton(fill)
    # The logits from NaN state against those from zero state, per file (0: bit for bit).
    out["nan_vs_zero_max_abs_logit_diff"] = {
        k: largest(zip(logits["zero"][k], logits["nan"][k])) for k in logits["zero"]
    }
    return out


def text_check(folder, text):
    import onnxruntime_genai as og

    tok = og.Tokenizer(og.Model(folder))
    ids = [int(i) for i in tok.encode(text)]
    return {"ids": ids, "text": tok.decode(np.array(ids, dtype=np.int32))}


def rewind_check(folder, prompt):
    import onnxruntime_genai as og

    model = og.Model(folder)
    n = json.load(open(f"{folder}/genai_config.json"))["model"]["context_length"]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=n, do_sample=False, batch_size=1)
    g = og.Generator(model, params)

    def run(ids):
        g.append_tokens(np.array([ids], dtype=np.int32))
        tokens, logits = [], []
        while not g.is_done():
            g.generate_next_token()
            tokens.append(int(g.get_next_tokens()[0]))
            logits.append(np.array(g.get_output("logits"))[0, -1].copy())
        return tokens, logits

    tokens, logits = run(prompt)
    sequence = prompt + tokens
    cases = []
    # Keep `keep` tokens: rewind to one less and append the last kept one (or the rest of
    # the prompt), as genai's rewind_to is meant to be used.
    for keep in [len(prompt) + len(tokens) // 2, len(prompt) - 1]:
        g.rewind_to(keep - 1)
        again, again_logits = run(sequence[keep - 1 : max(keep, len(prompt))])
        skip = max(0, keep - len(prompt))
        cases.append(
            {
                "kept": keep,
                "steps": len(again),
                "tokens_equal": again == tokens[skip:],
                "logits_equal": len(again_logits) == len(logits) - skip
                and all(np.array_equal(a, b) for a, b in zip(again_logits, logits[skip:])),
            }
        )
    return {"tokens": tokens, "cases": cases}


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "tokens":
        r = genai_tokens(args[0], parse_prompts(args[1]), int(args[2]))
    elif cmd == "state":
        r = state_check(args[0], args[1], parse_prompts(args[2])[0], *args[3:4])
    elif cmd == "text":
        r = text_check(args[0], args[1])
    elif cmd == "rewind":
        r = rewind_check(args[0], parse_prompts(args[1])[0])
    else:
        raise SystemExit(f"unknown command {cmd}")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
