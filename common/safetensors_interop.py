"""PyTorch's side of //common:safetensors_interop_test.

  safetensors_interop.py check FILE
      Loads FILE (written by ps::WriteSafetensors) with torch and compares it
      with the tensors the C++ test wrote; exits 1 and says what differs.
  safetensors_interop.py write FILE EXPECTED
      Saves a small batch-norm CNN's state_dict (plus a few other dtypes) with
      torch to FILE, and lists every tensor's exact values in EXPECTED, one
      line each: hex(utf-8 name) dtype rank dims... values...

Uses the `safetensors` package when it is installed; otherwise a loader and a
saver written here from the format's specification (struct + json +
torch.frombuffer), laid out as the reference implementation lays files out.
"""

import json
import struct
import sys

import torch

try:
    import safetensors.torch as st_torch
except ImportError:
    st_torch = None

# The reference implementation's dtype order (it writes larger dtypes first).
DTYPES = [
    ("BOOL", torch.bool),
    ("U8", torch.uint8),
    ("I8", torch.int8),
    ("I16", torch.int16),
    ("F16", torch.float16),
    ("BF16", torch.bfloat16),
    ("I32", torch.int32),
    ("F32", torch.float32),
    ("F64", torch.float64),
    ("I64", torch.int64),
]
TORCH_DTYPE = dict(DTYPES)
DTYPE_NAME = {t: n for n, t in DTYPES}
DTYPE_RANK = {t: i for i, (_, t) in enumerate(DTYPES)}


def load(path):
    """Returns (tensors by name in header order, metadata, header text)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header_text = blob[8:8 + n].decode("utf-8")
    header = json.loads(header_text)
    metadata = header.pop("__metadata__", {})
    buffer = bytearray(blob[8 + n:])
    if st_torch is not None:
        tensors = st_torch.load_file(path)
        return {k: tensors[k] for k in header}, metadata, header_text
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = TORCH_DTYPE[info["dtype"]]
        if begin == end:
            t = torch.empty(info["shape"], dtype=dtype)
        else:
            t = torch.frombuffer(buffer[begin:end], dtype=dtype).reshape(info["shape"])
        tensors[name] = t
    return tensors, metadata, header_text


def save(tensors, path, metadata):
    if st_torch is not None:
        st_torch.save_file(tensors, path, metadata=metadata)
        return
    order = sorted(tensors, key=lambda k: (-DTYPE_RANK[tensors[k].dtype], k))
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name in order:
        t = tensors[name].contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": DTYPE_NAME[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    # Default json.dumps escapes non-ASCII as \uXXXX (surrogate pairs too).
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def expected_from_cpp():
    """The tensors common/safetensors_interop_test.cc writes."""
    # The C++ side writes the bits 0x3C00, 0xC000, 0x3800.
    half = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float16)
    return {
        "conv1.weight": (torch.arange(24, dtype=torch.float32) * 0.25 - 3).reshape(2, 3, 2, 2),
        "conv1.bias": torch.tensor([0.5, -1.5]),
        "scale": torch.tensor(42.0),
        "empty": torch.empty(0, 3),
        "bn1.num_batches_tracked": torch.tensor(123, dtype=torch.int64),
        "ids": torch.tensor([-1, 2**40, 5], dtype=torch.int64),
        "half": half,
        "bf16": torch.tensor([1.0, -2.5], dtype=torch.bfloat16),
        "caf\u00e9 \U0001F600": torch.tensor([7.0]),
    }


def check(path):
    tensors, metadata, header_text = load(path)
    errors = []
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    if n % 8:
        errors.append("header length %d is not a multiple of 8" % n)
    if metadata != {"format": "pt", "note": 'x"y\n'}:
        errors.append("metadata %r" % (metadata,))
    expected = expected_from_cpp()
    if set(tensors) != set(expected):
        errors.append("names %r != %r" % (sorted(tensors), sorted(expected)))
    for name, want in expected.items():
        got = tensors.get(name)
        if got is None:
            continue
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            errors.append("%r: got %r, want %r" % (name, got, want))
    # The reference order: I64, then F32 by name, then BF16, then F16.
    names = [k for k in json.loads(header_text) if k != "__metadata__"]
    want_order = sorted(expected, key=lambda k: (-DTYPE_RANK[expected[k].dtype], k))
    if names != want_order:
        errors.append("header order %r != %r" % (names, want_order))
    if errors:
        print("\n".join(errors))
        return 1
    print("torch loaded %d tensors from %s (safetensors package: %s)"
          % (len(tensors), path, st_torch is not None))
    return 0


def write(path, expected_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3))
    model.train()
    with torch.no_grad():
        model(torch.randn(5, 1, 6, 6))  # running stats move, num_batches_tracked = 1
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tensors["extra.bf16"] = torch.tensor([1.5, -3.0, 1e-3]).to(torch.bfloat16)
    tensors["extra.f16"] = torch.tensor([[0.1, 65504.0], [-6e-8, 2.0]]).to(torch.float16)
    tensors["extra.i64"] = torch.tensor([[-(2**40)], [7]], dtype=torch.int64)
    tensors["extra.empty"] = torch.zeros(2, 0)
    tensors["\u00fcber.\U0001F600"] = torch.tensor(-0.75)
    save(tensors, path, {"format": "pt"})
    with open(expected_path, "w") as f:
        for name, t in tensors.items():
            values = t.reshape(-1).tolist() if t.dtype == torch.int64 else \
                t.reshape(-1).double().tolist()
            f.write(" ".join([name.encode("utf-8").hex(), DTYPE_NAME[t.dtype], str(t.dim())]
                             + [str(d) for d in t.shape] + [repr(v) for v in values]) + "\n")
    print("torch wrote %d tensors to %s (safetensors package: %s)"
          % (len(tensors), path, st_torch is not None))
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "check":
        return check(argv[2])
    if len(argv) == 4 and argv[1] == "write":
        return write(argv[2], argv[3])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
