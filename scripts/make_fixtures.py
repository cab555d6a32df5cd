"""Generates fixtures/ from the real third-party implementations (timm, g-mlp-pytorch,
g-mlp-gpt, gmlp-tinygrad).

Each fixture is a small model built with that library, trained for a few steps on real
data that ships inside a package (scikit-learn's 8x8 handwritten digits; the text of
CPython's LICENSE file, byte-level), so its weights are away from their init. Saved per
fixture, in fixtures/NAME/:
  model.safetensors  the library's state_dict, exactly as a user would save it (f32)
  io.safetensors     the inputs and the library's own outputs in eval mode (`logits`),
                     plus `labels` for classifiers
  meta.json          library, version, constructor arguments, the gmlp-onnx flags the
                     import needs (those not visible in the weights), training figures

g-mlp-gpt fixtures also hold model.pt (`torch.save(model.state_dict())`) and, in
io.safetensors, a shorter input (`input_ids_short`, `logits_short`) and the library's greedy
continuation of a prompt (`greedy_prompt`, `greedy_tokens`: argmax of the last position fed
back, up to seq_len tokens). gmlp-tinygrad fixtures are written by tinygrad itself
(`nn.state.safe_save`) with `inputs_embeds` and the library's `last_hidden_state`.

The Rust tests read these files; CI does not install torch or tinygrad. Regenerate with
(tinygrad's CPU device compiles with clang: `apt-get install clang`):
  python3 -m venv /tmp/fx && /tmp/fx/bin/pip install -r scripts/requirements-fixtures.txt
  DEV=CPU /tmp/fx/bin/python scripts/make_fixtures.py [--only timm,lucid,gpt,tinygrad]
"""
import json
import os
import sys
from functools import partial

import numpy as np
import torch
from safetensors.torch import save_file

import g_mlp_pytorch
import sklearn
import timm
from g_mlp_gpt import gMLPGPT
from g_mlp_pytorch import gMLP, gMLPVision
from sklearn.datasets import load_digits
from timm.layers import GatedMlp
from timm.models.mlp_mixer import MlpMixer, SpatialGatingBlock

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
STEPS = 60


def digits():
    """sklearn's digits: 1797 8x8 grayscale images, 10 classes; a fixed split."""
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(y), generator=g)
    train, test = perm[:1500], perm[1500:1564]
    return x[train], y[train], x[test], y[test]


def license_text():
    """CPython's LICENSE file as bytes (token ids 0..255)."""
    path = os.path.join(os.path.dirname(os.__file__), "LICENSE.txt")
    with open(path, "rb") as f:
        data = f.read()
    return torch.tensor(list(data), dtype=torch.int64)


def train_classifier(model, x, y):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    model.train()
    for _ in range(STEPS):
        idx = torch.randint(0, len(y), (64,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def train_lm(model, text, seq_len):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(2)
    limit = len(text) * 3 // 4 - seq_len - 1
    losses = []
    model.train()
    for _ in range(STEPS):
        starts = torch.randint(0, limit, (16,), generator=g)
        batch = torch.stack([text[s : s + seq_len + 1] for s in starts])
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def save(name, model, inputs, meta, extra=None):
    folder = os.path.join(ROOT, name)
    os.makedirs(folder, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(folder, "model.safetensors"))
    with torch.no_grad():
        logits = model(inputs)
    io = {meta["input_name"]: inputs.contiguous(), "logits": logits.contiguous()}
    if extra:
        io.update(extra)
    save_file(io, os.path.join(folder, "io.safetensors"))
    meta["params"] = int(sum(p.numel() for p in model.parameters()))
    meta["torch"] = torch.__version__
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{name}: {meta['params']} params, loss {meta['loss_first']:.3f} -> {meta['loss_last']:.3f}"
          + (f", test accuracy {meta['test_accuracy']:.4f}" if "test_accuracy" in meta else ""))


def vision_fixture(name, model, library, kwargs, flags):
    xtr, ytr, xte, yte = digits()
    losses = train_classifier(model, xtr, ytr)
    with torch.no_grad():
        acc = (model(xte).argmax(-1) == yte).float().mean().item()
    meta = dict(library=library, kwargs=kwargs, flags=flags, input_name="pixel_values",
                loss_first=losses[0], loss_last=losses[-1], test_accuracy=acc, steps=STEPS,
                data="sklearn load_digits, test split of 64 images")
    save(name, model, xte, meta, {"labels": yte})


def token_fixture(name, kwargs, flags, act=None):
    torch.manual_seed(sum(name.encode()))
    model = gMLP(**kwargs, **({"act": act} if act is not None else {}))
    text = license_text()
    losses = train_lm(model, text, kwargs["seq_len"])
    start = len(text) * 3 // 4
    inputs = torch.stack([text[start + 97 * i : start + 97 * i + kwargs["seq_len"]] for i in range(3)])
    if act is not None:
        kwargs = dict(kwargs, act=type(act).__name__)
    meta = dict(library="g-mlp-pytorch", version=g_mlp_pytorch_version(), kwargs=kwargs, flags=flags,
                input_name="input_ids", loss_first=losses[0], loss_last=losses[-1], steps=STEPS,
                data="CPython LICENSE.txt bytes, held-out last quarter")
    save(name, model, inputs, meta)


def gpt_fixture(name, kwargs, flags, act=None):
    """A g-mlp-gpt language model on the LICENSE bytes (`act`, a module, is not JSON)."""
    torch.manual_seed(sum(name.encode()))
    model = gMLPGPT(**kwargs, **({"act": act} if act is not None else {}))
    text = license_text()
    seq_len = kwargs["seq_len"]
    losses = train_lm(model, text, seq_len)
    start = len(text) * 3 // 4
    inputs = torch.stack([text[start + 97 * i : start + 97 * i + seq_len] for i in range(3)])
    # 13 tokens: not a multiple of any window or fold of these fixtures.
    short = inputs[:, :13].contiguous()
    prompt = text[start + 500 : start + 505].unsqueeze(0)
    tokens = prompt
    with torch.no_grad():
        logits_short = model(short)
        while tokens.shape[1] < seq_len:
            nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], 1)
    meta = dict(library="g-mlp-gpt", version=version("g-mlp-gpt"), flags=flags, input_name="input_ids",
                kwargs=dict(kwargs, act=type(act).__name__ if act is not None else "Identity"),
                loss_first=losses[0], loss_last=losses[-1], steps=STEPS,
                data="CPython LICENSE.txt bytes, held-out last quarter",
                greedy="argmax of the last position, fed back until seq_len tokens")
    extra = {"input_ids_short": short, "logits_short": logits_short.contiguous(),
             "greedy_prompt": prompt.contiguous(), "greedy_tokens": tokens[:, prompt.shape[1]:].contiguous()}
    save(name, model, inputs, meta, extra)
    torch.save(model.state_dict(), os.path.join(ROOT, name, "model.pt"))


def tinygrad_fixtures():
    """gmlp-tinygrad backbones trained with tinygrad to predict the next byte's embedding."""
    from tinygrad import Tensor, nn
    from tinygrad.nn.state import get_parameters, get_state_dict, safe_save
    from gmlp_tinygrad import gMLP as TinyGMLP
    from safetensors.numpy import save_file as save_numpy

    rng = np.random.default_rng(0)
    n, dim = 16, 16
    table = rng.standard_normal((256, dim)).astype(np.float32)
    text = license_text().numpy()
    mask = np.tril(np.ones((n, n), dtype=bool))
    for name, kwargs, causal in (("tiny_gmlp", dict(use_attn=False), False),
                                 ("tiny_amlp", dict(attn_dim=8), False),
                                 ("tiny_amlp_causal", dict(attn_dim=8), True)):
        Tensor.manual_seed(sum(name.encode()))
        model = TinyGMLP(dim=dim, num_layers=2, hidden_dim=32, max_seq_len=n, **kwargs)
        opt = nn.optim.Adam(get_parameters(model), lr=3e-3)
        m = Tensor(mask) if causal else None
        losses = []
        with Tensor.train():
            for _ in range(STEPS):
                starts = rng.integers(0, len(text) * 3 // 4 - n - 1, 8)
                batch = np.stack([text[s : s + n + 1] for s in starts])
                x, y = Tensor(table[batch[:, :-1]]), Tensor(table[batch[:, 1:]])
                loss = ((model(x, m) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.numpy()))
        start = len(text) * 3 // 4
        inputs = np.stack([table[text[start + 97 * i : start + 97 * i + n]] for i in range(3)])
        out = model(Tensor(inputs), m).numpy()
        folder = os.path.join(ROOT, name)
        os.makedirs(folder, exist_ok=True)
        safe_save(get_state_dict(model), os.path.join(folder, "model.safetensors"))
        save_numpy({"inputs_embeds": inputs, "last_hidden_state": out}, os.path.join(folder, "io.safetensors"))
        meta = dict(library="gmlp-tinygrad", version=version("gmlp-tinygrad"), tinygrad=version("tinygrad"),
                    kwargs=dict(kwargs, dim=dim, num_layers=2, hidden_dim=32, max_seq_len=n),
                    flags={"causal": True} if causal else {}, input_name="inputs_embeds",
                    loss_first=losses[0], loss_last=losses[-1], steps=STEPS,
                    data="CPython LICENSE.txt bytes through a fixed random embedding; next-byte regression",
                    params=int(sum(p.numel() for p in get_parameters(model))))
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2, sort_keys=True)
            f.write("\n")
        print(f"{name}: loss {losses[0]:.3f} -> {losses[-1]:.3f}")


def version(package):
    from importlib.metadata import version as installed
    return installed(package)


def g_mlp_pytorch_version():
    from importlib.metadata import version
    return version("g-mlp-pytorch")


def main():
    only = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else None
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, timm {timm.__version__}, g-mlp-pytorch {g_mlp_pytorch_version()}, "
          f"scikit-learn {sklearn.__version__}")
    if only is None or "timm" in only or "lucid" in only:
        timm_and_lucid_fixtures()
    if only is None or "gpt" in only:
        # g-mlp-gpt 0.0.15: one fixture per option that changes the forward pass.
        base = dict(num_tokens=256, dim=24, depth=2, seq_len=32, ff_mult=4)
        gpt_fixture("gpt_tokens", base, {})
        gpt_fixture("gpt_heads2_attn", dict(base, heads=2, attn_dim=8), {})
        gpt_fixture("gpt_window", dict(base, window=8, attn_dim=8), {"seq_len": 32})
        gpt_fixture("gpt_fold", dict(base, window=((8, 2), (32, 3)), attn_dim=8, heads=2), {})
        gpt_fixture("gpt_reversible", dict(base, reversible=True, window=((8, 1), (32, 2)), attn_dim=8), {})
        gpt_fixture("gpt_act_tanh", dict(base, attn_dim=8), {"gate_act": "tanh"}, act=torch.nn.Tanh())
        gpt_fixture("gpt_act_sigmoid", dict(base, heads=2), {"gate_act": "sigmoid"}, act=torch.nn.Sigmoid())
        # g-mlp-pytorch's own `act` option, causal aMLP.
        token_fixture("lucid_act_tanh", dict(base, causal=True, attn_dim=8),
                      {"causal": True, "gate_act": "tanh"}, act=torch.nn.Tanh())
    if only is None or "tinygrad" in only:
        tinygrad_fixtures()


def timm_and_lucid_fixtures():

    # timm gMLP (MlpMixer with SpatialGatingBlock / GatedMlp), as gmlp_ti16_224 builds it.
    kwargs = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, num_blocks=2, embed_dim=24, mlp_ratio=6)
    torch.manual_seed(10)
    model = MlpMixer(block_layer=SpatialGatingBlock, mlp_layer=GatedMlp, **kwargs)
    vision_fixture("timm_gmlp_vision", model, "timm", kwargs, {})
    fx = os.path.join(ROOT, "timm_gmlp_vision", "meta.json")
    meta = json.load(open(fx))
    meta["version"] = timm.__version__
    json.dump(meta, open(fx, "w"), indent=2, sort_keys=True)

    # g-mlp-pytorch vision.
    kwargs = dict(image_size=8, patch_size=2, num_classes=10, dim=24, depth=2, channels=1, ff_mult=4)
    torch.manual_seed(11)
    vision_fixture("lucid_vision", gMLPVision(**kwargs), "g-mlp-pytorch", kwargs, {"in_chans": 1})
    fx = os.path.join(ROOT, "lucid_vision", "meta.json")
    meta = json.load(open(fx))
    meta["version"] = g_mlp_pytorch_version()
    json.dump(meta, open(fx, "w"), indent=2, sort_keys=True)

    # g-mlp-pytorch token models.
    base = dict(num_tokens=256, dim=24, depth=2, seq_len=32, ff_mult=4)
    token_fixture("lucid_tokens", base, {})
    token_fixture("lucid_tokens_causal", dict(base, causal=True), {"causal": True})
    token_fixture("lucid_amlp_causal", dict(base, causal=True, attn_dim=16), {"causal": True})
    token_fixture("lucid_amlp", dict(base, attn_dim=16), {})
    token_fixture("lucid_heads2", dict(base, heads=2), {})
    token_fixture("lucid_circulant", dict(base, circulant_matrix=True), {})
    token_fixture("lucid_shift", dict(base, shift_tokens=1), {"shift_tokens": 1})
    token_fixture("lucid_shift_causal", dict(base, shift_tokens=2, causal=True, attn_dim=8),
                  {"shift_tokens": 2, "causal": True})

    # One checkpoint stored in bf16 and one in f16, as people save them to halve the size.
    for name, dtype in (("lucid_tokens", torch.bfloat16), ("timm_gmlp_vision", torch.float16)):
        folder = os.path.join(ROOT, name)
        from safetensors.torch import load_file
        state = load_file(os.path.join(folder, "model.safetensors"))
        suffix = "bf16" if dtype == torch.bfloat16 else "f16"
        save_file({k: v.to(dtype) for k, v in state.items()}, os.path.join(folder, f"model.{suffix}.safetensors"))


if __name__ == "__main__":
    sys.exit(main())
