#!/usr/bin/env bash
# Regenerates the fuzz seed corpora in fuzz/corpus/ (committed; the regression tests in
# tests/suite/hostile/ replay them). Seeds are small real inputs: models and checkpoints written
# by gmlp-onnx itself, .npz archives written by NumPy, and checkpoint manifests (see
# fuzz/bodies.rs) taken from the headers of the PyTorch fixtures in fixtures/.
# Needs: cargo, and a Python with numpy (GMLP_ONNX_PYTHON, else .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${GMLP_ONNX_PYTHON:-$PWD/.venv/bin/python}"
cargo build --quiet --release
bin=target/release/gmlp-onnx
out=fuzz/corpus
rm -rf "$out"
mkdir -p "$out"/{safetensors_reader,npz_reader,checkpoint_format,onnx_reader,pytorch_reader}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

tiny_tokens=(--preset amlp-base --layers 1 --d-model 8 --d-ffn 16 --attn-dim 4 --seq-len 6 --vocab-size 11)
tiny_vision=(--preset gmlp-ti16 --layers 1 --d-model 8 --d-ffn 16 --image-size 8 --patch-size 4 --num-classes 3)
q=(--init spread -q)

# ONNX models: token (expand, gather, causal, f16, external data), vision.
"$bin" build "${tiny_tokens[@]}" "${q[@]}" -o "$out/onnx_reader/tokens_expand.onnx" --save-weights "$tmp/tokens.safetensors"
"$bin" build "${tiny_tokens[@]}" "${q[@]}" --spatial toeplitz-gather --causal -o "$out/onnx_reader/tokens_gather_causal.onnx"
"$bin" build "${tiny_tokens[@]}" "${q[@]}" --dtype f16 --opset 21 -o "$out/onnx_reader/tokens_f16_opset21.onnx"
"$bin" build "${tiny_tokens[@]}" "${q[@]}" --external-data -o "$tmp/ext.onnx"
cp "$tmp/ext.onnx" "$out/onnx_reader/tokens_external.onnx"
"$bin" build "${tiny_vision[@]}" "${q[@]}" -o "$out/onnx_reader/vision.onnx" --save-weights "$tmp/vision.safetensors"
head -c 300 "$out/onnx_reader/vision.onnx" > "$out/onnx_reader/vision_truncated.onnx"

# safetensors: native checkpoints (with config metadata), f16/bf16 from a fixture-sized copy.
cp "$tmp/tokens.safetensors" "$out/safetensors_reader/native_tokens.safetensors"
cp "$tmp/vision.safetensors" "$out/safetensors_reader/native_vision.safetensors"
"$py" - "$out/safetensors_reader" <<'PY'
import json, struct, sys
out = sys.argv[1]
def write(name, tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for key, (dtype, shape, raw) in tensors.items():
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    open(f"{out}/{name}", "wb").write(struct.pack("<Q", len(h)) + h + data)
write("f16_bf16_f64.safetensors", {
    "a": ("F16", [2, 2], struct.pack("<4e", 1, -2, 0.5, 3)),
    "b": ("BF16", [3], bytes([0x80, 0x3f, 0x00, 0x40, 0x40, 0x40])),
    "c": ("F64", [], struct.pack("<d", 1.5)),
})
write("i64_and_nan.safetensors", {
    "ids": ("I64", [2], struct.pack("<2q", 1, 2)),
    "w": ("F32", [2], struct.pack("<2f", float("nan"), 1.0)),
})
write("empty_shape.safetensors", {"z": ("F32", [0, 4], b"")}, {"format": "pt"})
PY

# npz: arrays written by NumPy (the format's reference implementation).
"$py" - "$out/npz_reader" <<'PY'
import numpy as np, sys
out = sys.argv[1]
np.savez(f"{out}/f32_i64.npz", pixel_values=np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4), input_ids=np.arange(6, dtype=np.int64).reshape(2, 3))
np.savez_compressed(f"{out}/compressed_f64_i32.npz", a=np.ones((3, 1), np.float64), b=np.arange(4, dtype=np.int32))
np.savez(f"{out}/fortran_scalar.npz", f=np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)), s=np.float32(2.5))
np.savez(f"{out}/big_endian_bool.npz", be=np.arange(3, dtype=">f4"), flags=np.array([True, False]))
np.save(f"{out}/bare.npy", np.arange(5, dtype=np.float32))
PY

# Checkpoint manifests: one per fixture (names, shapes and dtypes from its header) and the
# native checkpoints above (with their metadata); see fuzz/bodies.rs for the format.
"$py" - "$out/checkpoint_format" fixtures/*/model*.safetensors "$tmp/tokens.safetensors" "$tmp/vision.safetensors" <<'PY'
import json, os, struct, sys
out = sys.argv[1]
for path in sys.argv[2:]:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    lines = []
    for key, value in header.items():
        if key == "__metadata__":
            lines += [f"@{k} {v}" for k, v in value.items()]
            continue
        dims = "x".join(map(str, value["shape"])) or "-"
        fill = "toeplitz" if "spatial" in key or "proj" in key else "ramp"
        lines.append(f"{key} {dims} {value['dtype']} {fill}")
    if path.startswith("fixtures/"):
        name = path[len("fixtures/"):].replace("/", "_").replace(".safetensors", "")
    else:
        name = "native_" + os.path.basename(path).replace(".safetensors", "")
    meta = os.path.join(os.path.dirname(path), "meta.json")
    flags = json.load(open(meta)).get("flags", {}) if os.path.exists(meta) else {}
    lines += ["!causal"] if flags.get("causal") else []
    lines += [f"!shift {flags['shift_tokens']}"] if "shift_tokens" in flags else []
    lines += [f"!in_chans {flags['in_chans']}"] if "in_chans" in flags else []
    open(f"{out}/{name}.txt", "w").write("\n".join(lines) + "\n")
PY
# PyTorch: small torch.save files from fixtures/pytorch (zip and legacy, every dtype,
# views, nesting, hostile globals), and bare data.pkl pickles for the wrapped path.
for f in dtypes.pt dtypes.legacy.pt views.pt views.legacy.pt views.model.pt \
         hostile_os_system.pt hostile_os_system.legacy.pt hostile_eval.pt no_state_dict.pt; do
  cp "fixtures/pytorch/$f" "$out/pytorch_reader/$f"
done
# A torch zip whose 21-character record folder makes its first central record as long as
# the zip64 end records (what zip 9.x misread), and the same state_dict nested.
cp "fixtures/pytorch/names/zip/789_-abcdefghijklmnop.pt" "$out/pytorch_reader/stem21.pt"
cp "fixtures/pytorch/names/nested/789_-abcdefghijklmnop.pt" "$out/pytorch_reader/stem21.nested.pt"
"$py" - "$out/pytorch_reader" <<'PY'
import sys, zipfile
for n in ["dtypes", "views", "views.model"]:
    z = zipfile.ZipFile(f"fixtures/pytorch/{n}.pt")
    name = [m for m in z.namelist() if m.endswith("/data.pkl")][0]
    open(f"{sys.argv[1]}/{n}.data.pkl", "wb").write(z.read(name))
PY
ls "$out"/* | head -50
