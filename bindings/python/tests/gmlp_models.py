"""Small upstream gMLP/aMLP modules for the tests, built here (not trained; every weight
moved off its init by a seeded jitter, as scripts/crosscheck_pytorch.py does, since some
heads and spatial weights start at zero).

Each case says what the command line needs beside the weights (``flags``, as the
fixtures' meta.json records them) and what ``read_source`` should find in the module
(``hints``). Imports torch and the upstream packages, never gmlp_onnx.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from torch import nn

VOCAB = 64
SEQ = 16


def jitter(module: nn.Module, seed: int) -> nn.Module:
    """Moves every parameter off its init (seeded), as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype))
    return module.eval()


@dataclass
class Case:
    """One module to export: how to build it, its primary input, and what the command
    needs (``flags``) and the module's classes answer (``hints``)."""

    name: str
    build: Callable[[], nn.Module]
    input_name: str
    input_shape: List[int]
    flags: Dict[str, Any]
    hints: Dict[str, Any]
    causal: bool = False
    library: str = "g-mlp-pytorch"
    label: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)

    def module(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(1000 + seed)
        return jitter(self.build(), seed)

    def inputs(self, batch: int = 2, length: Optional[int] = None, seed: int = 0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        if self.input_name == "input_ids":
            n = length if length is not None else self.input_shape[-1]
            return rng.integers(0, VOCAB, size=(batch, n), dtype=np.int64)
        return rng.standard_normal((batch, *self.input_shape)).astype(np.float32)


def _lucid(**kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from g_mlp_pytorch import gMLP

        return gMLP(**kwargs)

    return build


def _lucid_vision(**kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from g_mlp_pytorch import gMLPVision

        return gMLPVision(**kwargs)

    return build


def _timm(**kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from timm.layers import GatedMlp
        from timm.models.mlp_mixer import MlpMixer, SpatialGatingBlock

        return MlpMixer(block_layer=SpatialGatingBlock, mlp_layer=GatedMlp, **kwargs)

    return build


def _gpt(**kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from g_mlp_gpt import gMLPGPT

        return gMLPGPT(**kwargs)

    return build


TOKENS = dict(num_tokens=VOCAB, dim=16, depth=2, seq_len=SEQ, ff_mult=4)
LUCID_LABEL = "module g_mlp_pytorch.g_mlp_pytorch.gMLP"
NO_SHIFT = {"causal": False, "gate_act": "identity", "shift_tokens": 0}

CASES: Dict[str, Case] = {
    c.name: c
    for c in [
        Case("lucid_mlm", _lucid(**TOKENS), "input_ids", [SEQ], {}, dict(NO_SHIFT), label=LUCID_LABEL),
        Case(
            "lucid_causal_heads2",
            _lucid(**TOKENS, causal=True, heads=2),
            "input_ids",
            [SEQ],
            {"causal": True},
            dict(NO_SHIFT, causal=True),
            causal=True,
            label=LUCID_LABEL,
        ),
        Case("lucid_amlp", _lucid(**TOKENS, attn_dim=8), "input_ids", [SEQ], {}, dict(NO_SHIFT), label=LUCID_LABEL),
        Case(
            "lucid_act_tanh",
            _lucid(**TOKENS, causal=True, attn_dim=8, act=nn.Tanh()),
            "input_ids",
            [SEQ],
            {"causal": True, "gate_act": "tanh"},
            dict(NO_SHIFT, causal=True, gate_act="tanh"),
            causal=True,
            label=LUCID_LABEL,
        ),
        Case(
            "lucid_shift",
            _lucid(**TOKENS, shift_tokens=1),
            "input_ids",
            [SEQ],
            {"shift_tokens": 1},
            dict(NO_SHIFT, shift_tokens=1),
            label=LUCID_LABEL,
        ),
        Case(
            "lucid_shift_causal",
            _lucid(**TOKENS, causal=True, shift_tokens=2, attn_dim=8),
            "input_ids",
            [SEQ],
            {"causal": True, "shift_tokens": 2},
            dict(NO_SHIFT, causal=True, shift_tokens=2),
            causal=True,
            label=LUCID_LABEL,
        ),
        Case(
            "lucid_vision",
            _lucid_vision(image_size=8, patch_size=2, num_classes=5, dim=16, depth=2, channels=1, ff_mult=4),
            "pixel_values",
            [1, 8, 8],
            {"in_chans": 1},
            dict(NO_SHIFT, in_chans=1, patch_size=2),
            label="module g_mlp_pytorch.g_mlp_pytorch.gMLPVision",
        ),
        Case(
            "timm_gmlp",
            _timm(img_size=12, patch_size=3, in_chans=2, num_classes=7, num_blocks=2, embed_dim=16, mlp_ratio=4),
            "pixel_values",
            [2, 12, 12],
            {},
            {"causal": False},
            library="timm",
            label="module timm.models.mlp_mixer.MlpMixer",
        ),
        Case(
            "gpt_heads2_sigmoid",
            _gpt(**TOKENS, heads=2, attn_dim=8, act=nn.Sigmoid()),
            "input_ids",
            [SEQ],
            {"gate_act": "sigmoid"},
            {"causal": True, "gate_act": "sigmoid"},
            causal=True,
            library="g-mlp-gpt",
            label="module g_mlp_gpt.g_mlp_gpt.gMLPGPT",
        ),
        Case(
            "gpt_window",
            _gpt(**TOKENS, window=4, attn_dim=8),
            "input_ids",
            [SEQ],
            {"seq_len": SEQ},
            {"causal": True, "gate_act": "identity", "seq_len": SEQ},
            causal=True,
            library="g-mlp-gpt",
            label="module g_mlp_gpt.g_mlp_gpt.gMLPGPT",
        ),
    ]
}


def cli_flags(flags: Dict[str, Any]) -> List[str]:
    """``gmlp-onnx build`` flags of keywords: ``--name value``, a true bool as ``--name``."""
    out: List[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, str(value)]
    return out


def run_module(module: nn.Module, x: np.ndarray) -> np.ndarray:
    """The module's own eval/no_grad output on ``x``, as float32."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            t = torch.from_numpy(x)
            if t.is_floating_point():
                t = t.to(next(module.parameters()).dtype)
            return module(t).float().numpy()
    finally:
        module.train(was)


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| (float64)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def greedy(module: nn.Module, prompt: List[int], new_tokens: int) -> List[int]:
    """PyTorch greedy decoding: argmax of the last position, appended, the whole prefix run again."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = module(torch.tensor([ids], dtype=torch.int64))
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


def greedy_margin(module: nn.Module, prompt: List[int], new_tokens: int) -> float:
    """The smallest gap between the best and second-best logit over a greedy run (how far
    the picks are from a tie that rounding could flip)."""
    ids = list(prompt)
    margin = float("inf")
    with torch.no_grad():
        for _ in range(new_tokens):
            last = module(torch.tensor([ids], dtype=torch.int64))[0, -1]
            top = torch.topk(last, 2).values
            margin = min(margin, float(top[0] - top[1]))
            ids.append(int(last.argmax()))
    return margin


def folder_listing(path) -> List[str]:
    """The names in a folder, sorted (for checking that nothing stray is left)."""
    return sorted(os.listdir(path))
