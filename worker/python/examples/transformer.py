"""A small transformer encoder classifier trained through ps.torch with a
local Adam on a sum-only server: a model the C++ worker cannot express
(attention, layer norm, token embeddings) and an optimizer the server does
not run.

    PYTHONPATH=bazel-bin/worker/python /usr/bin/python3 -m ps.torch.run --workers=2 \
      --server=bazel-bin/server/server --server_arg=--optimizer=none -- \
      worker/python/examples/transformer.py --steps=300

The task is generated, so the example needs no data set: a sequence of
--seq_len tokens from a vocabulary of --vocab is labelled by the token that
occurs most often in it (ties go to the smallest token): a counting task
that the model learns in a few hundred steps; what the example shows is
the training path, not the task. Every worker generates the same
global batches (seeded by the step) and takes its rows rank, rank + W, ...;
the server publishes the mean gradient of each step (--optimizer=none) and
every worker applies it with the same torch.optim.Adam, so the replicas stay
equal. Rank 0 prints the training loss every --log_every steps and the
accuracy on a held-out set of generated sequences at the end. Exit status 0,
or 1 with the ps.Error printed.
"""

import argparse
import math
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

import ps
import ps.torch


class TransformerClassifier(nn.Module):
    """Token and position embeddings, nn.TransformerEncoder, mean pooling, a
    linear head. Dropout 0: the replicas' forward passes stay equal."""

    def __init__(self, vocab, seq_len, classes, dim=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(seq_len, dim) / math.sqrt(dim))
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position
        x = self.encoder(x)
        return self.head(self.norm(x.mean(1)))


def make_batch(n, vocab, seq_len, seed):
    """n sequences and their labels: the most frequent token (the smallest on a tie)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, seq_len), generator=g)
    counts = F.one_hot(tokens, vocab).sum(1)  # n x vocab
    # argmax returns the first maximum: the smallest token among ties.
    return tokens, counts.argmax(1)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch_size", type=int, default=64, help="global batch, all workers")
    p.add_argument("--vocab", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3, help="the workers' Adam")
    p.add_argument("--eval_size", type=int, default=2000)
    p.add_argument("--log_every", type=int, default=50)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if min(args.steps, args.batch_size, args.vocab, args.seq_len, args.eval_size) < 1:
        p.error("--steps, --batch_size, --vocab, --seq_len and --eval_size must be positive")
    return args


def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    ps.torch.init()
    rank, workers = ps.torch.rank(), ps.torch.size()
    if args.batch_size < workers:
        raise ValueError(f"--batch_size={args.batch_size} leaves a worker without samples")
    model = TransformerClassifier(args.vocab, args.seq_len, args.vocab, dim=args.dim,
                                  layers=args.layers)
    # A sum-only server (--optimizer=none): the mean gradient comes back and
    # each worker's Adam applies it.
    opt = ps.torch.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr),
                                        model.named_parameters())
    if rank == 0:
        print(f"transformer: {sum(p.numel() for p in model.parameters())} parameters; "
              f"{workers} workers, global batch {args.batch_size}, Adam lr {args.lr:g}",
              flush=True)
    start = time.monotonic()
    for step in range(1, args.steps + 1):
        tokens, labels = make_batch(args.batch_size, args.vocab, args.seq_len,
                                    args.seed * 1_000_003 + step)
        tokens, labels = tokens[rank::workers], labels[rank::workers]
        opt.zero_grad()
        opt.set_samples(len(labels))
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        opt.step()
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            print(f"step {step}: loss {loss.item():.4f} (rank 0's part; "
                  f"{time.monotonic() - start:.1f} s)", flush=True)
    if rank == 0:
        tokens, labels = make_batch(args.eval_size, args.vocab, args.seq_len, -1 - args.seed)
        model.eval()
        with torch.no_grad():
            accuracy = (model(tokens).argmax(1) == labels).float().mean().item()
        print(f"final: held-out accuracy {accuracy:.4f} over {args.eval_size} sequences "
              f"(chance about {1 / args.vocab:.2f})", flush=True)
    ps.torch.shutdown()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        train(args)
    except ps.Error as e:
        print(f"transformer: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
