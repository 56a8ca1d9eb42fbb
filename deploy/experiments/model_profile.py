#!/usr/bin/env python3
"""Model profiles: a model's parameter tensors and its per-layer compute
time, measured somewhere and read elsewhere (the simulator, simulate.py).
The format is described in deploy/experiments/README.md (Model profiles) and
below; this module reads and validates it.

    python3 deploy/experiments/model_profile.py FILE...   # validate; a summary line each, exit 1 on the first bad one

    import model_profile              # (deploy/experiments on sys.path; not "profile", the standard library's)
    p = model_profile.load(path)      # a validated dict, or ProfileError naming the field

A profile is one JSON object, version 1:

  format        "ps-model-profile"
  version       1
  model         its name (e.g. "resnet50")
  batch_size    the samples of one measured pass: every time below is ms
                per pass of this many samples (per batch, not per sample)
  measured      where and how: where, date, cpu, cores, threads, software
                (name -> version strings), steps, warmup_steps, statistic
                ("median"), note (optional: e.g. the machine was loaded)
  tensors       the parameter tensors in the model's parameter order (the
                order the worker registers them, the flat buffer's):
                {name, shape: [int, ...], dtype}
  layers        the modules that own parameters, in the order the forward
                pass reaches them: {name, tensors: [tensor names],
                forward_ms, backward_ms}; every tensor in exactly one layer.
                forward_ms: from this layer's start to the next layer's
                (the parameterless work after it, pooling, activations,
                attention's softmax, the loss after the last one, is its);
                backward_ms: the backward time just before this layer's
                gradients were all ready, since the previous layer's were
                (the first one's from the start of backward)
  input         optional: what one sample was (free text)
  totals        optional: {forward_ms, backward_ms} of whole passes
                (medians of the whole, so not exactly the layers' sums)

Standard library only.
"""

import json
import math
import sys

FORMAT = "ps-model-profile"
VERSION = 1
# Bytes per element of each dtype a tensor may have.
DTYPE_BYTES = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
INT64_MAX = 2**63 - 1
# Sane bounds: no tensor above 1 TiB, no model above 16 TiB (GPT-3's 175 G
# fp32 parameters are 0.7 TiB), no time above a day.
MAX_TENSOR_BYTES = 1 << 40
MAX_MODEL_BYTES = 1 << 44
MAX_MS = 86_400_000.0

TOP_FIELDS = {"format", "version", "model", "batch_size", "measured", "tensors", "layers",
              "input", "totals"}
MEASURED_FIELDS = {"where", "date", "cpu", "cores", "threads", "software", "steps",
                   "warmup_steps", "statistic", "note"}
MEASURED_OPTIONAL = {"note"}
TENSOR_FIELDS = {"name", "shape", "dtype"}
LAYER_FIELDS = {"name", "tensors", "forward_ms", "backward_ms"}


class ProfileError(ValueError):
    """A malformed profile: `field` is the path of what is wrong
    (e.g. "layers[3].forward_ms"), the message says why."""

    def __init__(self, field, message):
        super().__init__(f"{field}: {message}")
        self.field = field


def _fields(obj, path, allowed, optional=frozenset()):
    if not isinstance(obj, dict):
        raise ProfileError(path or "(profile)", f"must be a JSON object, not {type(obj).__name__}")
    for key in sorted(allowed - set(optional)):
        if key not in obj:
            raise ProfileError(f"{path}.{key}" if path else key, "missing")
    for key in obj:
        if key not in allowed:
            raise ProfileError(f"{path}.{key}" if path else key,
                               f"unknown field (known: {', '.join(sorted(allowed))})")


def _string(value, path):
    if not isinstance(value, str) or not value:
        raise ProfileError(path, f"must be a non-empty string, not {value!r}")


def _integer(value, path, least):
    # bool is an int in Python; a JSON true is not a count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(path, f"must be an integer, not {value!r}")
    if value < least:
        raise ProfileError(path, f"{value} is below {least}")


def _time_ms(value, path):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(path, f"must be a number of milliseconds, not {value!r}")
    if not math.isfinite(value):
        raise ProfileError(path, f"{value} is not finite")
    if value < 0:
        raise ProfileError(path, f"{value} is negative")
    if value > MAX_MS:
        raise ProfileError(path, f"{value} ms is more than a day")


def tensor_bytes(tensor):
    """Bytes of a validated tensor entry."""
    return math.prod(tensor["shape"]) * DTYPE_BYTES[tensor["dtype"]]


def validate(doc):
    """Returns doc if it is a well-formed profile; else raises ProfileError
    naming the first bad field."""
    _fields(doc, "", TOP_FIELDS, optional={"input", "totals"})
    if doc["format"] != FORMAT:
        raise ProfileError("format", f"is {doc['format']!r}, not {FORMAT!r}")
    if doc["version"] != VERSION or isinstance(doc["version"], bool):
        raise ProfileError("version", f"{doc['version']!r} is not a version this reader knows "
                           f"({VERSION})")
    _string(doc["model"], "model")
    _integer(doc["batch_size"], "batch_size", 1)
    if "input" in doc:
        _string(doc["input"], "input")

    m = doc["measured"]
    _fields(m, "measured", MEASURED_FIELDS, MEASURED_OPTIONAL)
    for key in ("where", "date", "cpu", "statistic"):
        _string(m[key], f"measured.{key}")
    for key, least in (("cores", 1), ("threads", 1), ("steps", 1), ("warmup_steps", 0)):
        _integer(m[key], f"measured.{key}", least)
    if "note" in m:
        _string(m["note"], "measured.note")
    if not isinstance(m["software"], dict) or not m["software"]:
        raise ProfileError("measured.software", "must be an object of name -> version")
    for name, version in m["software"].items():
        _string(version, f"measured.software.{name}")

    tensors = doc["tensors"]
    if not isinstance(tensors, list) or not tensors:
        raise ProfileError("tensors", "must be a non-empty list")
    names = {}
    total = 0
    for i, t in enumerate(tensors):
        path = f"tensors[{i}]"
        _fields(t, path, TENSOR_FIELDS)
        _string(t["name"], f"{path}.name")
        if t["name"] in names:
            raise ProfileError(f"{path}.name", f"{t['name']!r} repeats tensors[{names[t['name']]}]")
        names[t["name"]] = i
        if t["dtype"] not in DTYPE_BYTES:
            raise ProfileError(f"{path}.dtype", f"unknown dtype {t['dtype']!r} "
                               f"(known: {', '.join(DTYPE_BYTES)})")
        shape = t["shape"]
        if not isinstance(shape, list):
            raise ProfileError(f"{path}.shape", f"must be a list of sizes, not {shape!r}")
        elements = 1
        for j, size in enumerate(shape):
            _integer(size, f"{path}.shape[{j}]", 1)
            elements *= size  # Python's integers do not wrap: compare, then refuse
        if elements > INT64_MAX:
            raise ProfileError(f"{path}.shape", f"{elements} elements overflow int64")
        size_bytes = elements * DTYPE_BYTES[t["dtype"]]
        if size_bytes > MAX_TENSOR_BYTES:
            raise ProfileError(f"{path}.shape", f"{size_bytes} bytes exceed the bound of "
                               f"{MAX_TENSOR_BYTES} for one tensor")
        total += size_bytes
    if total > MAX_MODEL_BYTES:
        raise ProfileError("tensors", f"{total} bytes in all exceed the bound of {MAX_MODEL_BYTES}")

    layers = doc["layers"]
    if not isinstance(layers, list) or not layers:
        raise ProfileError("layers", "must be a non-empty list")
    owner = {}
    layer_names = set()
    for i, layer in enumerate(layers):
        path = f"layers[{i}]"
        _fields(layer, path, LAYER_FIELDS)
        _string(layer["name"], f"{path}.name")
        if layer["name"] in layer_names:
            raise ProfileError(f"{path}.name", f"{layer['name']!r} repeats")
        layer_names.add(layer["name"])
        _time_ms(layer["forward_ms"], f"{path}.forward_ms")
        _time_ms(layer["backward_ms"], f"{path}.backward_ms")
        if not isinstance(layer["tensors"], list) or not layer["tensors"]:
            raise ProfileError(f"{path}.tensors", "must be a non-empty list of tensor names")
        for j, name in enumerate(layer["tensors"]):
            if name not in names:
                raise ProfileError(f"{path}.tensors[{j}]", f"{name!r} is not in tensors")
            if name in owner:
                raise ProfileError(f"{path}.tensors[{j}]", f"{name!r} is layers[{owner[name]}]'s too")
            owner[name] = i
    for name, i in names.items():
        if name not in owner:
            raise ProfileError(f"tensors[{i}]", f"{name!r} is in no layer: the layers must "
                               "cover every tensor")

    if "totals" in doc:
        _fields(doc["totals"], "totals", {"forward_ms", "backward_ms"})
        _time_ms(doc["totals"]["forward_ms"], "totals.forward_ms")
        _time_ms(doc["totals"]["backward_ms"], "totals.backward_ms")
    return doc


def load(path):
    """The validated profile in the JSON file at path (ProfileError, with
    the file named, when it is not one)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ProfileError("(file)", f"{path}: {e}") from e
    try:
        return validate(doc)
    except ProfileError as e:
        raise ProfileError(e.field, f"{path}: {str(e)[len(e.field) + 2:]}") from e


def summary(doc):
    params = sum(math.prod(t["shape"]) for t in doc["tensors"])
    model_bytes = sum(tensor_bytes(t) for t in doc["tensors"])
    fwd = sum(layer["forward_ms"] for layer in doc["layers"])
    bwd = sum(layer["backward_ms"] for layer in doc["layers"])
    return (f"{doc['model']}: {params:,} parameters ({model_bytes / 1e6:.1f} MB) in "
            f"{len(doc['tensors'])} tensors, {len(doc['layers'])} layers; batch "
            f"{doc['batch_size']}: forward {fwd:.1f} ms, backward {bwd:.1f} ms "
            f"(measured on {doc['measured']['where']})")


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    for path in argv:
        try:
            print(summary(load(path)))
        except ProfileError as e:
            print(f"profile: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
