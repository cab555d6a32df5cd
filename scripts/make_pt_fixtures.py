"""Generates the PyTorch checkpoint fixtures (torch.save files) from the existing fixtures.

Real models: each fixture's model.safetensors is loaded into the library's own module
(timm MlpMixer, g-mlp-pytorch gMLP / gMLPVision, built from meta.json), the module is
checked to reproduce io.safetensors exactly, and then saved with torch.save as users do:
  fixtures/timm_gmlp_vision/model.pt         torch.save(model.state_dict())
  fixtures/lucid_vision/model.ckpt.pt        {"model": state_dict, "optimizer": Adam state, "epoch": 3}
  fixtures/lucid_tokens/model.legacy.pt      the same, _use_new_zipfile_serialization=False
  fixtures/lucid_amlp_causal/model.lightning.pt  {"state_dict": ..., "epoch", "global_step", ...}
so the expected outputs are the ones already in each io.safetensors.

Synthetic (fixtures/pytorch/): tensors of every dtype, strided views and storages shared
by several tensors, each saved with torch.save (zip and legacy) next to NAME.expected.npz,
the same tensors made contiguous and written by NumPy as float64; and hostile files, which
must be refused without anything being run: os.system and builtins.eval reductions,
and a whole pickled model (torch.save(model)).

Regenerate with (torch etc. from scripts/requirements-fixtures.txt):
  .venv-fixtures/bin/python scripts/make_pt_fixtures.py
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file

from g_mlp_pytorch import gMLP, gMLPVision
from timm.layers import GatedMlp
from timm.models.mlp_mixer import MlpMixer, SpatialGatingBlock

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
SYN = os.path.join(ROOT, "pytorch")


def module_for(name):
    """The library module of fixture `name`, with its trained weights, checked against io."""
    folder = os.path.join(ROOT, name)
    meta = json.load(open(os.path.join(folder, "meta.json")))
    kwargs = meta["kwargs"]
    if meta["library"] == "timm":
        model = MlpMixer(block_layer=SpatialGatingBlock, mlp_layer=GatedMlp, **kwargs)
    elif meta["input_name"] == "pixel_values":
        model = gMLPVision(**kwargs)
    else:
        model = gMLP(**kwargs)
    model.load_state_dict(load_file(os.path.join(folder, "model.safetensors")), strict=True)
    model.eval()
    io = load_file(os.path.join(folder, "io.safetensors"))
    with torch.no_grad():
        logits = model(io[meta["input_name"]])
    # The same weights and inputs: equal up to float summation order (threads, kernels).
    rel = ((logits - io["logits"]).abs().max() / io["logits"].abs().max()).item()
    assert rel < 1e-6, f"{name}: the module does not reproduce io.safetensors ({rel:.2e})"
    print(f"{name}: module reproduces io.safetensors (max rel diff {rel:.1e})")
    return model, folder


def optimizer_state(model):
    """An Adam state after one step on a zero loss gradient: tensors, floats, ints, lists."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    return opt.state_dict()


def real_models():
    model, folder = module_for("timm_gmlp_vision")
    torch.save(model.state_dict(), os.path.join(folder, "model.pt"))

    model, folder = module_for("lucid_vision")
    sd = model.state_dict()
    torch.save({"model": sd, "optimizer": optimizer_state(model), "epoch": 3},
               os.path.join(folder, "model.ckpt.pt"))
    model.load_state_dict(sd)

    model, folder = module_for("lucid_tokens")
    torch.save(model.state_dict(), os.path.join(folder, "model.legacy.pt"),
               _use_new_zipfile_serialization=False)

    model, folder = module_for("lucid_amlp_causal")
    # What a LightningModule checkpoint holds, with the module's weights under their names.
    torch.save({"epoch": 0, "global_step": 60, "pytorch-lightning_version": "2.5.0",
                "state_dict": model.state_dict(), "loops": {}, "callbacks": {},
                "lr_schedulers": [], "hparams_name": "kwargs",
                "hyper_parameters": {"dim": 24, "depth": 2, "causal": True}},
               os.path.join(folder, "model.lightning.pt"))


def expected(name, tensors):
    np.savez(os.path.join(SYN, f"{name}.expected.npz"),
             **{k: v.contiguous().to(torch.float64).numpy() for k, v in tensors.items()})


def synthetic():
    os.makedirs(SYN, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    base = torch.randn(4, 6, generator=g)
    dtypes = {
        "f32": base.clone(),
        "f16": base.to(torch.float16),
        "bf16": base.to(torch.bfloat16),
        "f64": base.to(torch.float64) / 3,
        "i64": torch.arange(-6, 6, dtype=torch.int64).reshape(3, 4),
        "i32": torch.arange(-3, 3, dtype=torch.int32),
        "i16": torch.arange(-3, 3, dtype=torch.int16),
        "i8": torch.arange(-3, 3, dtype=torch.int8),
        "u8": torch.arange(250, 256, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    torch.save(dtypes, os.path.join(SYN, "dtypes.pt"))
    torch.save(dtypes, os.path.join(SYN, "dtypes.legacy.pt"), _use_new_zipfile_serialization=False)
    expected("dtypes", dtypes)

    grid = torch.arange(60, dtype=torch.float32).reshape(5, 12) / 7
    halves = torch.randn(6, 8, generator=g).to(torch.float16)
    views = {
        "grid": grid,                      # the whole storage
        "transposed": grid.t(),            # stride (1, 12)
        "window": grid[1:4, 3:9],          # offset 15, stride (12, 1)
        "every_third": grid[:, ::3],       # stride (12, 3)
        "row": grid[2],                    # offset 24, shares the storage
        "column": grid[:, 5],              # stride (12,)
        "expanded": grid[0, :4].expand(3, 4),  # stride (0, 1)
        "half_t": halves.t()[2:],          # f16, non-contiguous with an offset
    }
    torch.save(views, os.path.join(SYN, "views.pt"))
    torch.save(views, os.path.join(SYN, "views.legacy.pt"), _use_new_zipfile_serialization=False)
    expected("views", views)
    # The same tensors nested as training scripts save them.
    torch.save({"state_dict": views, "epoch": 7}, os.path.join(SYN, "views.state_dict.pt"))
    torch.save({"model": views, "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}},
               os.path.join(SYN, "views.model.pt"))
    # Nothing that reads as a state_dict.
    torch.save({"epoch": 7, "weights": [views["grid"]]}, os.path.join(SYN, "no_state_dict.pt"))


class RunsACommand:
    """Unpickling this would run a shell command that creates a file in the working folder."""

    def __reduce__(self):
        return (os.system, ("touch pwned_by_pickle",))


class EvaluatesCode:
    def __reduce__(self):
        return (eval, ("__import__('os').system('touch pwned_by_pickle')",))


def hostile():
    w = torch.ones(2)
    # The command comes first, so that Python's own unpickler runs it before it needs torch
    # (the hostile test shows with Python that the file is live).
    torch.save({"x": RunsACommand(), "w": w}, os.path.join(SYN, "hostile_os_system.pt"))
    torch.save({"x": RunsACommand(), "w": w}, os.path.join(SYN, "hostile_os_system.legacy.pt"),
               _use_new_zipfile_serialization=False)
    torch.save({"w": EvaluatesCode()}, os.path.join(SYN, "hostile_eval.pt"))
    model, _ = module_for("timm_gmlp_vision")
    torch.save(model, os.path.join(SYN, "whole_model.pt"))


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}")
    real_models()
    synthetic()
    hostile()
    for folder, _, files in sorted(os.walk(ROOT)):
        for f in sorted(files):
            if f.endswith(".pt") or f.endswith(".npz"):
                path = os.path.join(folder, f)
                print(f"{os.path.relpath(path, ROOT)}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    sys.exit(main())
