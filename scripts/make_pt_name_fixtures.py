"""Generates fixtures/pytorch/names/: torch.save files under names of every length.

torch.save names the zip archive's top folder after the file (`NAME.pt` holds `NAME/data.pkl`,
`NAME/data/0`, ...), so the archive's layout, and whether a zip reader finds its central
directory, depends on the length of the name: zip 9.x refused every file whose stem has 21
characters. For each stem length L = 1..64 this writes, from one random state_dict of a few
small tensors (float32, float16, bfloat16, float64, int64; ranks 0 to 3; a transposed,
non-contiguous view among them):

  names/zip/STEM.pt          torch.save(state_dict)                  (zip archive, folder STEM)
  names/nested/STEM.pt       torch.save({"state_dict": ..., "epoch": L})
  names/legacy/STEM.pt       torch.save(..., _use_new_zipfile_serialization=False)
  names/safetensors/STEM.safetensors  the same tensors made contiguous, by safetensors.torch

tests/suite/pytorch.rs reads every torch file and checks it equals its safetensors copy exactly.

Regenerate with torch 2.15.0 and safetensors 0.8.0 (scripts/requirements-fixtures.txt):
  python scripts/make_pt_name_fixtures.py
"""
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "pytorch", "names")
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789_-"
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]


def stem(length):
    """A file stem of `length` characters (varied, so that no two lengths share a prefix)."""
    return "".join(ALPHABET[(length * 7 + i) % len(ALPHABET)] for i in range(length))


def state_dict(length):
    g = torch.Generator().manual_seed(1000 + length)
    count = 2 + length % 3
    sd = {}
    for i in range(count):
        rank = int(torch.randint(0, 4, (1,), generator=g))
        shape = [int(d) for d in torch.randint(1, 6, (rank,), generator=g)]
        dtype = DTYPES[(length + i) % len(DTYPES)]
        if dtype == torch.int64:
            t = torch.randint(-1000, 1000, shape, generator=g, dtype=torch.int64)
        else:
            t = torch.randn(shape, generator=g).to(dtype)
        sd[f"blocks.{i}.weight"] = t
    # A transposed view: stride (1, rows), the storage shared with nothing else.
    base = torch.randn(3, 4, generator=g)
    sd["head.weight_t"] = base.t()
    return sd


def main():
    print(f"torch {torch.__version__}")
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    for kind in ["zip", "nested", "legacy", "safetensors"]:
        os.makedirs(os.path.join(ROOT, kind))
    total = 0
    for length in range(1, 65):
        name = stem(length)
        sd = state_dict(length)
        paths = [os.path.join(ROOT, "zip", f"{name}.pt"),
                 os.path.join(ROOT, "nested", f"{name}.pt"),
                 os.path.join(ROOT, "legacy", f"{name}.pt"),
                 os.path.join(ROOT, "safetensors", f"{name}.safetensors")]
        torch.save(sd, paths[0])
        torch.save({"state_dict": sd, "epoch": length}, paths[1])
        torch.save(sd, paths[2], _use_new_zipfile_serialization=False)
        save_file({k: v.contiguous().clone() for k, v in sd.items()}, paths[3])
        total += sum(os.path.getsize(p) for p in paths)
    print(f"{4 * 64} files, {total} bytes under {os.path.relpath(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
