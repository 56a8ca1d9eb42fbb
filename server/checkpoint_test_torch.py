"""PyTorch's side of //server:checkpoint_test.

  checkpoint_test_torch.py PARAMS_FILE OUT
      Loads PARAMS_FILE (a checkpoint's params-<v>.safetensors) into a small
      torch model, Linear(4, 3) -> BatchNorm1d(3) -> Linear(3, 2), with
      model.load_state_dict(tensors, strict=False), checks that only the
      batch-norm buffers were missing and nothing was unexpected, and writes
      each parameter of the model to OUT, one line each:
          name value.hex() value.hex() ...
      in state_dict order, so the C++ side compares the bits it wrote. Exits 1
      and says why on any difference.

Uses safetensors.torch.load_file when the `safetensors` package is installed;
otherwise a loader written here from the format's specification (struct +
json + torch.frombuffer), as common/safetensors_interop.py does.
"""

import json
import struct
import sys

import torch

try:
    import safetensors.torch as st_torch
except ImportError:
    st_torch = None


def load_file(path):
    if st_torch is not None:
        return st_torch.load_file(path)
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    data = bytearray(blob[8 + n:])
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise ValueError("%s: dtype %s, expected F32" % (name, info["dtype"]))
        begin, end = info["data_offsets"]
        if begin == end:
            tensors[name] = torch.empty(info["shape"], dtype=torch.float32)
        else:
            tensors[name] = torch.frombuffer(data[begin:end], dtype=torch.float32).reshape(
                info["shape"])
    return tensors


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    params_path, out_path = argv[1], argv[2]
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                                torch.nn.Linear(3, 2))
    tensors = load_file(params_path)
    result = model.load_state_dict(tensors, strict=False)
    errors = []
    # Batch norm fills in a missing num_batches_tracked itself (torch >= 1.x
    # reports it missing or not, depending on the version).
    want_missing = {"1.running_mean", "1.running_var"}
    if set(result.missing_keys) - {"1.num_batches_tracked"} != want_missing:
        errors.append("missing keys %r, expected %r" % (sorted(result.missing_keys),
                                                         sorted(want_missing)))
    if result.unexpected_keys:
        errors.append("unexpected keys %r" % (result.unexpected_keys,))
    state = model.state_dict()
    for name, t in tensors.items():
        if name in state and not torch.equal(state[name], t):
            errors.append("%s: the model holds %r, the file %r" % (name, state[name], t))
    if errors:
        print("\n".join(errors))
        return 1
    with open(out_path, "w") as f:
        for name, p in model.named_parameters():
            values = p.detach().reshape(-1).double().tolist()
            f.write(" ".join([name] + [v.hex() for v in values]) + "\n")
    print("torch loaded %d tensors from %s into the model (safetensors package: %s)"
          % (len(tensors), params_path, st_torch is not None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
