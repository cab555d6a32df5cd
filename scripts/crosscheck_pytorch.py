"""Cross-checks `gmlp-onnx build --weights` against PyTorch on models the tests never saw.

Builds several timm / g-mlp-pytorch models with sizes, channels and heads unlike the
fixtures, saves their state_dicts as safetensors, converts each with the gmlp-onnx binary
(only the flags the weights cannot show), runs the ONNX file in ONNX Runtime and compares
with the library's own outputs. Needs scripts/requirements-fixtures.txt plus onnxruntime.

Usage: python scripts/crosscheck_pytorch.py path/to/gmlp-onnx WORKDIR
"""
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import timm
import torch
from g_mlp_pytorch import gMLP, gMLPVision
from safetensors.torch import save_file


def run_case(exe, work, name, model, inputs, flags, input_name):
    model.eval()
    path = os.path.join(work, f"{name}.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    with torch.no_grad():
        ref = model(inputs).numpy()
    out = os.path.join(work, f"{name}.onnx")
    cmd = [exe, "build", "--weights", path, "-o", out, "-q", *flags]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    got = ort.InferenceSession(out).run(None, {input_name: inputs.numpy()})[0]
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    line = f"{name}: flags {flags or '-'}: ONNX Runtime vs PyTorch max|diff|/max|ref| = {rel:.2e}"
    if got.ndim == 2:
        line += f", argmax agreement {np.mean(got.argmax(-1) == ref.argmax(-1)) * 100:.1f}%"
    print(line)
    return rel <= 1e-4 and (got.ndim != 2 or (got.argmax(-1) == ref.argmax(-1)).all())


def jitter(model):
    """Moves every parameter off its init, as training would."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))


def main(exe, work):
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    ok = True
    # timm's own preset architecture (gMLP-Ti/16, 224x224x3), untrained, 10 classes.
    m = timm.create_model("gmlp_ti16_224", pretrained=False, num_classes=10)
    jitter(m)  # timm initializes the head to zero
    ok &= run_case(exe, work, "timm_gmlp_ti16", m, torch.randn(2, 3, 224, 224), [], "pixel_values")
    # timm gMLP with other channels / patch / image / widths, weights moved off their init.
    from timm.layers import GatedMlp
    from timm.models.mlp_mixer import MlpMixer, SpatialGatingBlock
    m = MlpMixer(img_size=48, patch_size=6, in_chans=5, num_classes=7, num_blocks=3, embed_dim=40, mlp_ratio=3,
                 block_layer=SpatialGatingBlock, mlp_layer=GatedMlp)
    jitter(m)
    ok &= run_case(exe, work, "timm_c5_p6", m, torch.randn(3, 5, 48, 48), [], "pixel_values")
    # g-mlp-pytorch causal aMLP, 4 heads, other sizes.
    m = gMLP(num_tokens=500, dim=64, depth=3, seq_len=40, heads=4, attn_dim=24, causal=True, ff_mult=3)
    jitter(m)
    ok &= run_case(exe, work, "lucid_amlp_causal_h4", m, torch.randint(0, 500, (2, 40)), ["--causal"], "input_ids")
    # g-mlp-pytorch bidirectional, circulant, 2 heads.
    m = gMLP(num_tokens=300, dim=32, depth=2, seq_len=24, heads=2, circulant_matrix=True)
    jitter(m)
    ok &= run_case(exe, work, "lucid_circulant_h2", m, torch.randint(0, 300, (2, 24)), [], "input_ids")
    # g-mlp-pytorch vision, 3 channels, attention.
    m = gMLPVision(image_size=32, patch_size=8, num_classes=5, dim=48, depth=2, heads=2, attn_dim=16)
    jitter(m)
    ok &= run_case(exe, work, "lucid_vision_c3_h2", m, torch.randn(4, 3, 32, 32), [], "pixel_values")
    print("ALL OK" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
