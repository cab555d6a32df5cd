"""Makes the torch.onnx.export peer for the speed comparison (bench/run.py, bench/speed.py).

Builds g-mlp-pytorch's aMLP with the given sizes (weights moved off their init), saves
the state_dict as safetensors (the input of `gmlp-onnx build --weights`), exports the
same model with torch.onnx.export at opset 17, and saves one input batch (inputs.npz) and
PyTorch's outputs (expected.npz) for `gmlp-onnx validate --inputs --expected`.

Usage: python bench/make_peer.py OUT_DIR [--depth 36] [--seq-len 256] [--dynamo]
"""
import argparse
import os

import numpy as np
import torch
from g_mlp_pytorch import gMLP
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--depth", type=int, default=36)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--dynamo", action="store_true", help="use the dynamo exporter instead of TorchScript")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    model = gMLP(num_tokens=32000, dim=512, depth=a.depth, seq_len=a.seq_len, ff_mult=6, attn_dim=64)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    model.eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(a.out, "amlp.safetensors"))
    ids = torch.randint(0, 32000, (1, a.seq_len))
    with torch.no_grad():
        ref = model(ids)
    np.savez(os.path.join(a.out, "inputs.npz"), input_ids=ids.numpy())
    np.savez(os.path.join(a.out, "expected.npz"), logits=ref.numpy())
    torch.onnx.export(
        model,
        (ids,),
        os.path.join(a.out, "peer.onnx"),
        input_names=["input_ids"],
        output_names=["logits"],
        opset_version=17,
        dynamic_axes={"input_ids": {0: "batch"}, "logits": {0: "batch"}},
        dynamo=a.dynamo,
    )
    print(f"wrote {a.out}/amlp.safetensors, peer.onnx, inputs.npz, expected.npz (torch {torch.__version__})")


if __name__ == "__main__":
    main()
