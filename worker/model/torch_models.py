"""torch.nn equivalents of the C++ models in worker/model/model.cc.

Each builder returns a module whose state_dict keys, shapes and order equal
the C++ model's parameters() followed, per module, by its buffers(): loading a
safetensors file written from a C++ replica (flat_parameters() and
flat_buffers() split by name) into these modules reproduces the replica, so
they serve as a test oracle. num_batches_tracked is F32 on the C++ side and
int64 here; load_state_dict converts.

    /usr/bin/python3 worker/model/torch_models.py           # every model's keys
    /usr/bin/python3 worker/model/torch_models.py --count   # counts only
    /usr/bin/python3 worker/model/torch_models.py --testdata worker/model/testdata

--testdata regenerates the files model_test.cc compares against:
torch_specs.txt (every key, shape and order) and torch_golden.txt (loss,
gradient and buffer checksums of one training step from the C++ models'
exact initial weights, reproduced here bit for bit by init_from_seed).
"""

import argparse
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class SoftmaxRegression(nn.Module):
    """softmax: fc.{weight,bias}."""

    def __init__(self, input_shape=(1, 28, 28), num_classes=10):
        super().__init__()
        self.fc = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(x, 1))


class Mlp(nn.Module):
    """mlp: fc1..fcH hidden (each followed by ReLU), fc<H+1> output."""

    def __init__(self, input_shape=(1, 28, 28), num_classes=10, hidden=(256,)):
        super().__init__()
        width = math.prod(input_shape)
        self.num_layers = len(hidden) + 1
        for i, h in enumerate(hidden):
            setattr(self, f"fc{i + 1}", nn.Linear(width, h))
            width = h
        setattr(self, f"fc{self.num_layers}", nn.Linear(width, num_classes))

    def forward(self, x):
        x = torch.flatten(x, 1)
        for i in range(1, self.num_layers):
            x = F.relu(getattr(self, f"fc{i}")(x))
        return getattr(self, f"fc{self.num_layers}")(x)


class LeNet(nn.Module):
    """lenet (sigmoid, average pooling) / lenet_relu (ReLU, max pooling):
    conv1, conv2, fc1, fc2, fc3 .{weight,bias}. D2L section 7.6."""

    def __init__(self, input_shape=(1, 28, 28), num_classes=10, relu=False):
        super().__init__()
        self.conv1 = nn.Conv2d(input_shape[0], 6, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)
        self.act = F.relu if relu else torch.sigmoid
        self.pool = (lambda x: F.max_pool2d(x, 2, 2)) if relu else (lambda x: F.avg_pool2d(x, 2, 2))

    def forward(self, x):
        x = self.pool(self.act(self.conv1(x)))
        x = self.pool(self.act(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.fc3(x)


class Residual(nn.Module):
    """D2L's Residual (section 8.6); registration order conv1, conv2, conv3,
    bn1, bn2 as in D2L, which fixes the state_dict order."""

    def __init__(self, in_channels, out_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
        if use_1x1conv:
            self.conv3 = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=strides)
        else:
            self.conv3 = None
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return F.relu(y + x)


class Stem(nn.Module):
    """ResNet-18's b1: b1.conv, b1.bn, then ReLU; resnet18's conv is 7x7/2
    and 3x3/2 max pooling follows, resnet18_cifar's (small_image) is 3x3/1
    with no pooling."""

    def __init__(self, in_channels, small_image=False):
        super().__init__()
        if small_image:
            self.conv = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1)
        else:
            self.conv = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3)
        self.bn = nn.BatchNorm2d(64)
        self.small_image = small_image

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        if self.small_image:
            return x
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)


class ResNet18(nn.Module):
    """resnet18 (D2L section 8.6) or, with small_image, resnet18_cifar (D2L
    section 13.6's "slightly modified ResNet-18": 3x3/1 stem, no max
    pooling): b1, stage1..stage4 of block0/block1 (64, 128, 256, 512
    channels; block0 of stages 2-4 has a strided 1x1 shortcut conv3), global
    average pooling, fc."""

    def __init__(self, input_shape=(1, 28, 28), num_classes=10, small_image=False):
        super().__init__()
        self.b1 = Stem(input_shape[0], small_image)
        in_ch = 64
        for s, ch in enumerate((64, 128, 256, 512)):
            stage = nn.Module()
            for b in range(2):
                down = b == 0 and s > 0
                setattr(stage, f"block{b}", Residual(in_ch, ch, use_1x1conv=down,
                                                     strides=2 if down else 1))
                in_ch = ch
            setattr(self, f"stage{s + 1}", stage)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.b1(x)
        for s in range(1, 5):
            stage = getattr(self, f"stage{s}")
            x = stage.block1(stage.block0(x))
        x = F.adaptive_avg_pool2d(x, (1, 1))
        return self.fc(torch.flatten(x, 1))


def init_like_cpp(model):
    """Xavier-uniform conv/linear weights, zero biases (as D2L's init_cnn and
    Model::Initialize; the random values differ, the distribution is equal)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def build(name, input_shape=(1, 28, 28), num_classes=10, mlp_hidden=(256,)):
    """The torch module for ModelConfig{name, input_shape, num_classes,
    mlp_hidden}."""
    if name == "softmax":
        return SoftmaxRegression(input_shape, num_classes)
    if name == "mlp":
        return Mlp(input_shape, num_classes, mlp_hidden)
    if name == "lenet":
        return LeNet(input_shape, num_classes, relu=False)
    if name == "lenet_relu":
        return LeNet(input_shape, num_classes, relu=True)
    if name == "resnet18":
        return ResNet18(input_shape, num_classes)
    if name == "resnet18_cifar":
        return ResNet18(input_shape, num_classes, small_image=True)
    raise ValueError(f"unknown model name {name!r}")


class SplitMix64:
    """The C++ SplitMix64 (common/rng.h): the same stream, the same floats."""

    MASK = (1 << 64) - 1

    def __init__(self, seed):
        self.state = seed & self.MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return z ^ (z >> 31)

    def uniform(self, n):
        """n floats in [0, 1): the top 24 bits of each draw, times 2^-24."""
        return np.array([self.next() >> 40 for _ in range(n)], dtype=np.float32) * np.float32(
            1.0 / 16777216.0)


def init_from_seed(model, seed):
    """Exactly the C++ Model::Initialize(seed): one splitmix64 stream over the
    parameters in order; Xavier-uniform conv/linear weights from it (in fp32:
    (2u - 1) * bound, bound = float(sqrt(6 / (fan_in + fan_out)))), zero
    biases, batch-norm weight 1, bias 0, running mean 0, var 1, count 0."""
    rng = SplitMix64(seed)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, p in model.named_parameters():
            owner = modules[name.rsplit(".", 1)[0]]
            if isinstance(owner, (nn.Conv2d, nn.Linear)) and name.endswith(".weight"):
                area = math.prod(p.shape[2:]) if p.dim() > 2 else 1
                fan_in, fan_out = p.shape[1] * area, p.shape[0] * area
                bound = np.float32(math.sqrt(6.0 / (fan_in + fan_out)))
                u = rng.uniform(p.numel())
                values = (np.float32(2) * u - np.float32(1)) * bound
                p.copy_(torch.from_numpy(values.astype(np.float32)).reshape(p.shape))
            elif isinstance(owner, nn.BatchNorm2d) and name.endswith(".weight"):
                p.fill_(1)
            else:
                p.zero_()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.reset_running_stats()
    return model


def golden_batch(n, shape, classes):
    """The deterministic batch model_test.cc builds: x[i] = float((i * 37) %
    101) / 50 - 1 in fp32, labels[i] = (i * 3) % classes."""
    count = n * math.prod(shape)
    i = np.arange(count, dtype=np.int64)
    x = ((i * 37) % 101).astype(np.float32) / np.float32(50) - np.float32(1)
    labels = (np.arange(n, dtype=np.int64) * 3) % classes
    return torch.from_numpy(x.reshape(n, *shape)), torch.from_numpy(labels)


def checksums(t):
    """(sum, position-weighted sum with weights (i % 7) - 3, sum of |.|) in
    float64 over the flattened tensor."""
    v = t.detach().reshape(-1).double()
    w = (torch.arange(v.numel()) % 7 - 3).double()
    return v.sum().item(), (v * w).sum().item(), v.abs().sum().item()


# (model, input shape, classes, mlp hidden, batch) of torch_golden.txt.
GOLDEN_CONFIGS = [
    ("softmax", (1, 28, 28), 10, (256,), 4),
    ("mlp", (1, 28, 28), 10, (64, 32), 4),
    ("lenet", (1, 28, 28), 10, (256,), 4),
    ("lenet_relu", (1, 28, 28), 10, (256,), 4),
    ("resnet18", (3, 32, 32), 10, (256,), 4),
    ("resnet18_cifar", (3, 32, 32), 10, (256,), 4),
]
GOLDEN_SEED = 42


def write_golden(path):
    """One training step (train-mode forward, summed cross-entropy, backward)
    then one evaluation (inference mode, after the running statistics were
    updated) per config, seeded with GOLDEN_SEED."""
    torch.set_num_threads(2)
    with open(path, "w") as f:
        f.write("# Generated by worker/model/torch_models.py --testdata; do not edit.\n")
        f.write("# config <name> <C,H,W> <classes> <hidden,...> <batch> <seed>\n")
        f.write("# train_loss_sum / train_correct / eval_loss_sum / eval_correct <value>\n")
        f.write("# grad|param|buffer <name> <sum> <weighted sum> <abs sum>\n")
        for name, shape, classes, hidden, batch in GOLDEN_CONFIGS:
            model = init_from_seed(build(name, shape, classes, hidden), GOLDEN_SEED)
            x, labels = golden_batch(batch, shape, classes)
            f.write(f"config {name} {','.join(map(str, shape))} {classes} "
                    f"{','.join(map(str, hidden))} {batch} {GOLDEN_SEED}\n")
            for pname, p in model.named_parameters():
                f.write("param %s %.17g %.17g %.17g\n" % ((pname,) + checksums(p)))
            model.train()
            logits = model(x)
            loss = F.cross_entropy(logits, labels, reduction="sum")
            loss.backward()
            correct = (logits.argmax(1) == labels).sum().item()
            f.write("train_loss_sum %.17g\ntrain_correct %d\n" % (loss.item(), correct))
            for pname, p in model.named_parameters():
                f.write("grad %s %.17g %.17g %.17g\n" % ((pname,) + checksums(p.grad)))
            for bname, b in model.named_buffers():
                f.write("buffer %s %.17g %.17g %.17g\n" % ((bname,) + checksums(b)))
            model.eval()
            with torch.no_grad():
                logits = model(x)
                loss = F.cross_entropy(logits, labels, reduction="sum")
            correct = (logits.argmax(1) == labels).sum().item()
            f.write("eval_loss_sum %.17g\neval_correct %d\n" % (loss.item(), correct))


# (model, input shape, classes, mlp hidden) of torch_specs.txt.
SPEC_CONFIGS = [
    ("softmax", (1, 28, 28), 10, (256,)),
    ("mlp", (1, 28, 28), 10, (256,)),
    ("mlp", (3, 8, 8), 5, (32, 16, 8)),
    ("lenet", (1, 28, 28), 10, (256,)),
    ("lenet_relu", (1, 28, 28), 10, (256,)),
    ("resnet18", (1, 28, 28), 10, (256,)),
    ("resnet18", (3, 32, 32), 100, (256,)),
    ("resnet18_cifar", (1, 28, 28), 10, (256,)),
    ("resnet18_cifar", (3, 32, 32), 100, (256,)),
]


def write_specs(path):
    with open(path, "w") as f:
        f.write("# Generated by worker/model/torch_models.py --testdata; do not edit.\n")
        f.write("# config <name> <C,H,W> <classes> <hidden,...>, then the state_dict:\n")
        f.write("# P <parameter name> <dims> / B <buffer name> <dims> (dims '-' for a scalar)\n")
        for name, shape, classes, hidden in SPEC_CONFIGS:
            model = build(name, shape, classes, hidden)
            f.write(f"config {name} {','.join(map(str, shape))} {classes} "
                    f"{','.join(map(str, hidden))}\n")
            for n, s in parameter_specs(model):
                f.write(f"P {n} {','.join(map(str, s)) or '-'}\n")
            for n, s in buffer_specs(model):
                f.write(f"B {n} {','.join(map(str, s)) or '-'}\n")


def parameter_specs(model):
    """[(name, shape)] in the C++ parameters() order."""
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def buffer_specs(model):
    """[(name, shape)] in the C++ buffers() order."""
    return [(n, tuple(b.shape)) for n, b in model.named_buffers()]


def load_flat(model, flat_parameters, flat_buffers=None):
    """Loads the C++ flat buffers (1-D float tensors in parameters() /
    buffers() order) into `model`."""
    state = {}
    offset = 0
    for name, p in model.named_parameters():
        n = p.numel()
        state[name] = flat_parameters[offset:offset + n].reshape(p.shape)
        offset += n
    assert offset == flat_parameters.numel(), (offset, flat_parameters.numel())
    if flat_buffers is not None:
        offset = 0
        for name, b in model.named_buffers():
            n = b.numel()
            state[name] = flat_buffers[offset:offset + n].reshape(b.shape).to(b.dtype)
            offset += n
        assert offset == flat_buffers.numel(), (offset, flat_buffers.numel())
    model.load_state_dict(state, strict=flat_buffers is not None)
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", action="store_true")
    parser.add_argument("--testdata", metavar="DIR")
    args = parser.parse_args()
    if args.testdata:
        write_specs(f"{args.testdata}/torch_specs.txt")
        write_golden(f"{args.testdata}/torch_golden.txt")
        return
    configs = [
        ("softmax", (1, 28, 28), 10),
        ("mlp", (1, 28, 28), 10),
        ("lenet", (1, 28, 28), 10),
        ("lenet_relu", (1, 28, 28), 10),
        ("resnet18", (1, 28, 28), 10),
        ("resnet18", (3, 32, 32), 10),
        ("resnet18_cifar", (1, 28, 28), 10),
        ("resnet18_cifar", (3, 32, 32), 10),
    ]
    for name, shape, classes in configs:
        model = build(name, shape, classes)
        params = parameter_specs(model)
        buffers = buffer_specs(model)
        total = sum(math.prod(s) for _, s in params)
        total_buffers = sum(math.prod(s) for _, s in buffers)
        print(f"{name} {list(shape)} classes={classes}: {len(params)} parameter tensors, "
              f"{total} parameters; {len(buffers)} buffer tensors, {total_buffers} elements")
        if not args.count:
            for n, s in params:
                print(f"  P {n} {list(s)}")
            for n, s in buffers:
                print(f"  B {n} {list(s)}")
        model.eval()
        with torch.no_grad():
            out = model(torch.zeros(2, *shape))
        assert tuple(out.shape) == (2, classes), out.shape


if __name__ == "__main__":
    main()
