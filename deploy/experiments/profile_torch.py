#!/usr/bin/env python3
"""Measures a model profile (model_profile.py's format) of a PyTorch model:
its parameter tensors and each parameter-owning module's forward and
backward time, the median over a few training passes on the CPU.

    /usr/bin/python3 deploy/experiments/profile_torch.py --model=resnet50 --batch_size=4 \\
        --steps=3 --out=deploy/experiments/profiles/resnet50.json --note="..."
    /usr/bin/python3 deploy/experiments/profile_torch.py --model=vgg16 ...
    /usr/bin/python3 deploy/experiments/profile_torch.py --model=bert_base --batch_size=2 --seq_len=128 ...

From Python, any torch.nn.Module: profile(model, make_batch, loss_fn, ...).

How a pass is timed (one thread's clock, time.perf_counter_ns):
  forward   a forward pre-hook on every module that owns parameters
            (recurse=False) stamps its first call each pass; a layer's
            forward_ms runs from its stamp to the next layer's (the
            parameterless modules and functions in between are its), the
            first from the start of the pass, the last to the loss
  backward  a hook on every parameter stamps when its gradient is made; a
            layer is ready when all of its tensors' are; in the order the
            layers became ready, each one's backward_ms is the time since
            the one before (the first one's since backward() was called)
Each layer's figure is the median over --steps passes after
--warmup_steps. Debian 12's python3-torch (1.13) has no torchvision: the
three models here are defined in plain torch.nn with the parameter names
and shapes of torchvision's resnet50 and vgg16 and of Hugging Face's
BertModel (bert-base-uncased); main() checks their parameter counts.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_profile  # noqa: E402

DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
          torch.float64: "float64"}


# --- The architectures (torchvision's and Hugging Face's names and shapes) ---

class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """torchvision.models.resnet50: 25,557,032 parameters."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, 3)
        self.layer2 = self._make_layer(128, 4, stride=2)
        self.layer3 = self._make_layer(256, 6, stride=2)
        self.layer4 = self._make_layer(512, 3, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride,
                                                 bias=False), nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class VGG16(nn.Module):
    """torchvision.models.vgg16 (no batch norm): 138,357,544 parameters."""

    def __init__(self, num_classes=1000):
        super().__init__()
        layers, channels = [], 3
        for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                  512, 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, v, 3, padding=1), nn.ReLU(inplace=True)]
                channels = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(),
            nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class BertEmbeddings(nn.Module):
    def __init__(self, vocab, hidden, positions, types):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(positions, hidden)
        self.token_type_embeddings = nn.Embedding(types, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = (self.word_embeddings(ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(torch.zeros_like(ids)))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        b, n, h = x.shape

        def split(t):
            return t.view(b, n, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / (h // self.heads) ** 0.5
        context = torch.matmul(self.dropout(scores.softmax(-1)), v)
        return context.transpose(1, 2).reshape(b, n, h)


class BertSelfOutput(nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.dense = nn.Linear(inner, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.self = BertSelfAttention(hidden, heads)
        self.output = BertSelfOutput(hidden, hidden)

    def forward(self, x):
        return self.output(self.self(x), x)


class BertIntermediate(nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.dense = nn.Linear(hidden, inner)

    def forward(self, x):
        return nn.functional.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, hidden, heads, inner):
        super().__init__()
        self.attention = BertAttention(hidden, heads)
        self.intermediate = BertIntermediate(hidden, inner)
        self.output = BertSelfOutput(hidden, inner)

    def forward(self, x):
        a = self.attention(x)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, layers, hidden, heads, inner):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(hidden, heads, inner) for _ in range(layers)])

    def forward(self, x):
        for layer in self.layer:
            x = layer(x)
        return x


class BertPooler(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, x):
        return torch.tanh(self.dense(x[:, 0]))


class BertBase(nn.Module):
    """transformers.BertModel(bert-base-uncased): 12 layers, hidden 768, 12
    heads, 3072 inner, vocabulary 30,522, 512 positions: 109,482,240
    parameters."""

    def __init__(self, layers=12, hidden=768, heads=12, inner=3072, vocab=30522,
                 positions=512, types=2):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, hidden, positions, types)
        self.encoder = BertEncoder(layers, hidden, heads, inner)
        self.pooler = BertPooler(hidden)

    def forward(self, ids):
        return self.pooler(self.encoder(self.embeddings(ids)))


# Each model: constructor and its parameter count.
MODELS = {
    "resnet50": (ResNet50, 25_557_032),
    "vgg16": (VGG16, 138_357_544),
    "bert_base": (BertBase, 109_482_240),
}


def project_model(name):
    """The C++ worker's own models (--model=lenet, --model=mlp:4096x4096 as
    sweep.py names it), from worker/model/torch_models.py, which has their
    exact parameter names and shapes; Fashion-MNIST's 1x28x28 inputs."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "worker", "model"))
    import torch_models
    base, _, hidden = name.partition(":")
    widths = tuple(int(h) for h in hidden.split("x")) if hidden else (256,)
    return torch_models.build(base, mlp_hidden=widths)


def image_batch(batch_size):
    x = torch.randn(batch_size, 3, 224, 224)
    y = torch.randint(0, 1000, (batch_size,))
    return x, y, "3x224x224 float32 image, 1,000 classes (cross-entropy)"


def token_batch(batch_size, seq_len):
    ids = torch.randint(0, 30522, (batch_size, seq_len))
    return ids, None, (f"{seq_len} tokens; loss: mean square of the pooled output "
                       "(BertModel has no head)")


# --- The profiler, for any module ---

def layers_of(model):
    """(name, module, [parameter names]) of every module owning parameters
    directly, in the model's own order."""
    out = []
    for name, module in model.named_modules():
        own = [f"{name}.{p}" if name else p for p, _ in module.named_parameters(recurse=False)]
        if own:
            out.append((name or "(root)", module, own))
    return out


def profile(model, inputs, loss_fn, steps, warmup_steps):
    """Times `steps` training passes after `warmup_steps` (gradients zeroed,
    no optimizer: its time is the server's). Returns (tensors, layers,
    totals) in model_profile's format."""
    params = dict(model.named_parameters())
    layers = layers_of(model)
    owner = {p: i for i, (_, _, names) in enumerate(layers) for p in names}
    state = {}

    def pre_hook(i):
        def hook(module, args):
            state["fwd"].setdefault(i, time.perf_counter_ns())
        return hook

    def grad_hook(name):
        def hook(grad):
            state["grad"][name] = time.perf_counter_ns()
        return hook

    handles = [m.register_forward_pre_hook(pre_hook(i)) for i, (_, m, _) in enumerate(layers)]
    handles += [p.register_hook(grad_hook(n)) for n, p in params.items() if p.requires_grad]
    fwd_samples = [[] for _ in layers]
    bwd_samples = [[] for _ in layers]
    totals = {"forward_ms": [], "backward_ms": []}
    order = None
    model.train()
    try:
        for step in range(warmup_steps + steps):
            model.zero_grad(set_to_none=True)
            state["fwd"], state["grad"] = {}, {}
            t0 = time.perf_counter_ns()
            loss = loss_fn(model(inputs[0]), inputs[1])
            t1 = time.perf_counter_ns()
            loss.backward()
            t2 = time.perf_counter_ns()
            if step < warmup_steps:
                continue
            # Forward order: the layers in the order their first calls came.
            reached = sorted(state["fwd"], key=state["fwd"].get)
            if len(reached) != len(layers):
                missing = [layers[i][0] for i in range(len(layers)) if i not in state["fwd"]]
                raise RuntimeError(f"layers the forward pass never called: {missing[:5]}")
            if order is None:
                order = reached
            elif reached != order:
                raise RuntimeError("the forward pass called the layers in another order")
            starts = [state["fwd"][i] for i in order] + [t1]
            starts[0] = t0  # the first layer's time counts from the pass's start
            for k, i in enumerate(order):
                fwd_samples[i].append((starts[k + 1] - starts[k]) / 1e6)
            ready = {}
            for name, t in state["grad"].items():
                ready[owner[name]] = max(ready.get(owner[name], 0), t)
            if len(ready) != len(layers):
                raise RuntimeError("some layers' parameters got no gradient")
            previous = t1
            for i in sorted(ready, key=ready.get):
                bwd_samples[i].append((ready[i] - previous) / 1e6)
                previous = ready[i]
            totals["forward_ms"].append((t1 - t0) / 1e6)
            totals["backward_ms"].append((t2 - t1) / 1e6)
    finally:
        for h in handles:
            h.remove()
    tensors = [{"name": n, "shape": list(p.shape), "dtype": DTYPES[p.dtype]}
               for n, p in params.items()]
    out_layers = [{"name": layers[i][0], "tensors": layers[i][2],
                   "forward_ms": round(statistics.median(fwd_samples[i]), 4),
                   "backward_ms": round(statistics.median(bwd_samples[i]), 4)} for i in order]
    return tensors, out_layers, {k: round(statistics.median(v), 3) for k, v in totals.items()}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True,
                   help=f"{', '.join(sorted(MODELS))}, or the worker's lenet, mlp[:HxH...]")
    p.add_argument("--batch_size", type=int, default=2)
    p.add_argument("--seq_len", type=int, default=128, help="bert_base's tokens per sample")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup_steps", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--where", default=platform.node() or "unknown",
                   help="the machine, in words (the profile's measured.where)")
    p.add_argument("--note", default="", help="measured.note: e.g. what else loaded the machine")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    if a.model in MODELS:
        make, expected = MODELS[a.model]
        model = make()
        count = sum(t.numel() for t in model.parameters())
        if count != expected:
            sys.exit(f"profile_torch: {a.model} has {count:,} parameters, not the real model's "
                     f"{expected:,}")
    else:
        model = project_model(a.model)
    if a.model.split(":")[0] in ("lenet", "lenet_relu", "mlp", "softmax"):
        x = torch.randn(a.batch_size, 1, 28, 28)
        y = torch.randint(0, 10, (a.batch_size,))
        what = "1x28x28 float32 image (Fashion-MNIST), 10 classes (cross-entropy)"
        loss_fn = nn.functional.cross_entropy
    elif a.model == "bert_base":
        x, y, what = token_batch(a.batch_size, a.seq_len)

        def loss_fn(out, _):
            return out.pow(2).mean()
    else:
        x, y, what = image_batch(a.batch_size)
        loss_fn = nn.functional.cross_entropy
    tensors, layers, totals = profile(model, (x, y), loss_fn, a.steps, a.warmup_steps)
    doc = {
        "format": model_profile.FORMAT,
        "version": model_profile.VERSION,
        "model": a.model,
        "batch_size": a.batch_size,
        "input": what,
        "measured": {
            "where": a.where,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "cpu": cpu_model(),
            "cores": os.cpu_count() or 1,
            "threads": torch.get_num_threads(),
            "software": {"torch": torch.__version__, "python": platform.python_version(),
                         "profiler": "deploy/experiments/profile_torch.py"},
            "steps": a.steps,
            "warmup_steps": a.warmup_steps,
            "statistic": "median",
        },
        "tensors": tensors,
        "layers": layers,
        "totals": totals,
    }
    if a.note:
        doc["measured"]["note"] = a.note
    model_profile.validate(doc)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(model_profile.summary(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
