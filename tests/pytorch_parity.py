"""PyTorch's side of //tests:pytorch_parity_test: the oracle the C++ trainer
is checked against. It reads the files the C++ test writes (weights and
samples as safetensors) and writes what PyTorch makes of them; the C++ test
does the comparing.

  pytorch_parity.py evaluate MODEL WEIGHTS SAMPLES OUT
      Loads WEIGHTS (written by ps::worker::SaveWeights) into
      torch_models.build(MODEL) and evaluates it in eval mode (batch norm on
      its running statistics) on SAMPLES. Writes OUT, one "key value" a line:
      samples, correct, accuracy, loss (mean cross-entropy) and min_margin
      (the smallest gap between the two largest logits, which says how close
      the nearest tie was).

  pytorch_parity.py sgd MODEL WEIGHTS SAMPLES LR MOMENTUM WEIGHT_DECAY BATCH OUT DTYPE
      Loads WEIGHTS, then for each consecutive BATCH samples of SAMPLES runs
      one torch.optim.SGD step (train mode, nn.CrossEntropyLoss with mean
      reduction), and saves the resulting state_dict (parameters and
      buffers, num_batches_tracked as I64) to OUT as safetensors. DTYPE
      "float32" is the parity oracle; "float64" computes the same steps in
      double precision (saved rounded to float32), a nearly exact answer that
      tells a bug (far from it) from ill-conditioning (PyTorch's own float32
      run just as far from it). "float32_im2col" is float32 with PyTorch's
      oneDNN convolutions turned off (im2col and BLAS instead): a second,
      equally valid float32 answer, whose distance from the float64 one
      measures how far float32 rounding alone can move these steps.

SAMPLES holds "pixels" (U8 [N, C, H, W], raw) and "labels" (I64 [N]); inputs
are pixels / 255, the trainer's default Normalization. MODEL may carry mlp
hidden widths after a colon: "mlp:256" or "mlp:64,32".

The safetensors reader and writer here are the format's specification
(8-byte little-endian header length, JSON header, raw little-endian data),
written out so that the test needs no `safetensors` package.
"""

import json
import os
import struct
import sys

import numpy as np
import torch
from torch import nn

# worker/model/torch_models.py: in the runfiles when the test's data carries
# it (that needs exports_files(["torch_models.py"]) in worker/model/BUILD),
# else beside this script's source in the checkout.
for _here in (os.path.abspath(__file__), os.path.realpath(__file__)):
    _dir = os.path.join(os.path.dirname(_here), "..", "worker", "model")
    if os.path.exists(os.path.join(_dir, "torch_models.py")):
        sys.path.insert(0, _dir)
        break
import torch_models  # noqa: E402

NUMPY_DTYPE = {"F32": np.float32, "I64": np.int64, "U8": np.uint8, "I32": np.int32}
DTYPE_NAME = {torch.float32: "F32", torch.int64: "I64"}


def load_safetensors(path):
    """{name: torch tensor} in header order."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=NUMPY_DTYPE[info["dtype"]])
        out[name] = torch.from_numpy(array.copy()).reshape(info["shape"])
    return out


def save_safetensors(path, tensors):
    """Writes {name: F32 or I64 tensor} in the given order."""
    header = {}
    chunks = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAME[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def build_model(spec, weights, input_shape, num_classes):
    """The torch model for MODEL[:hidden] with WEIGHTS loaded (strictly)."""
    name, _, hidden = spec.partition(":")
    mlp_hidden = tuple(int(h) for h in hidden.split(",")) if hidden else (256,)
    model = torch_models.build(name, tuple(input_shape), num_classes, mlp_hidden)
    state = load_safetensors(weights)
    own = model.state_dict()
    # Same keys, shapes and dtypes (num_batches_tracked is I64 on both sides):
    # anything else is a naming or layout bug, not something to convert.
    for key, value in own.items():
        if key not in state:
            raise SystemExit(f"{weights}: no tensor {key}")
        if state[key].shape != value.shape or state[key].dtype != value.dtype:
            raise SystemExit(f"{weights}: {key} is {state[key].dtype} {list(state[key].shape)}, "
                             f"torch has {value.dtype} {list(value.shape)}")
    extra = set(state) - set(own)
    if extra:
        raise SystemExit(f"{weights}: unexpected tensors {sorted(extra)}")
    model.load_state_dict(state, strict=True)
    return model


def load_samples(path):
    samples = load_safetensors(path)
    pixels, labels = samples["pixels"], samples["labels"]
    # The trainer's default Normalization: pixel * (1/255), no mean or std.
    return pixels.to(torch.float32) / 255.0, labels


def evaluate(spec, weights, samples_path, out):
    x, labels = load_samples(samples_path)
    model = build_model(spec, weights, x.shape[1:], 10)
    model.eval()
    loss_sum, correct, min_margin = 0.0, 0, float("inf")
    with torch.no_grad():
        for begin in range(0, x.shape[0], 1000):
            logits = model(x[begin:begin + 1000])
            y = labels[begin:begin + 1000]
            loss_sum += nn.functional.cross_entropy(logits, y, reduction="sum").double().item()
            correct += (logits.argmax(1) == y).sum().item()
            top2 = logits.topk(2, dim=1).values
            min_margin = min(min_margin, (top2[:, 0] - top2[:, 1]).min().item())
    n = x.shape[0]
    with open(out, "w") as f:
        f.write(f"samples {n}\ncorrect {correct}\naccuracy {correct / n:.17g}\n"
                f"loss {loss_sum / n:.17g}\nmin_margin {min_margin:.17g}\n")


def sgd(spec, weights, samples_path, lr, momentum, weight_decay, batch, out, dtype):
    x, labels = load_samples(samples_path)
    model = build_model(spec, weights, x.shape[1:], 10).to(dtype)
    x = x.to(dtype)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                                weight_decay=weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    if x.shape[0] % batch != 0:
        raise SystemExit(f"{x.shape[0]} samples do not make whole batches of {batch}")
    for begin in range(0, x.shape[0], batch):
        optimizer.zero_grad()
        loss = loss_fn(model(x[begin:begin + batch]), labels[begin:begin + batch])
        loss.backward()
        optimizer.step()
        print(f"torch {str(dtype)[6:]} step {begin // batch}: loss {loss.item():.6f}")
    save_safetensors(out, {k: v.float() if v.is_floating_point() else v
                           for k, v in model.state_dict().items()})


def main(argv):
    torch.manual_seed(0)
    torch.set_num_threads(2)
    if len(argv) == 6 and argv[1] == "evaluate":
        evaluate(*argv[2:6])
    elif len(argv) == 11 and argv[1] == "sgd" and argv[10] in ("float32", "float64",
                                                              "float32_im2col"):
        torch.backends.mkldnn.enabled = argv[10] != "float32_im2col"
        sgd(argv[2], argv[3], argv[4], float(argv[5]), float(argv[6]), float(argv[7]),
            int(argv[8]), argv[9], getattr(torch, argv[10].split("_")[0]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
