"""ps.torch's core: one worker process's connection, registration and optimizer.

Contracts (docs/pytorch.md has the walk-through):

* init() first; every other call before it raises ps.Error
  FAILED_PRECONDITION naming the call. One job per process: init once,
  shutdown() to close.
* Registration (broadcast_parameters or DistributedOptimizer, whichever
  comes first) sends the model's signature (names, shapes, in the order
  given) with this worker's current values; the server keeps rank 0's as
  version 0, and every worker's parameters are then overwritten with the
  version the job is at. A worker whose model differs is refused by the
  server naming the first difference (ps.Error).
* Parameters are CPU float32 tensors that require grad; anything else is
  refused naming the tensor.
* One DistributedOptimizer per process, one backward per step: a
  parameter's gradient is copied (times this worker's sample count) into a
  flat float32 buffer when its AccumulateGrad node has run, and a bucket of
  the server's segments is pushed as soon as every parameter overlapping it
  has its gradient, while backward goes on. step() pushes what is left,
  waits for the next version and applies it.
* Sample counts: pushes carry gradient sums, so each worker's mean gradient
  is multiplied by its sample count. The count is needed while backward
  pushes, so it is set before backward: set_samples(n) (it stays until set
  again). The default, 1, is the equal-parts convention: each worker's loss
  is the mean over an equal part of the global batch, and the server's mean
  of the workers' means is the global batch's mean gradient.
  step(num_samples=n) states the count of the iteration just computed: it
  must equal the count the pushes used (ps.Error otherwise, pointing at
  set_samples), unless nothing was pushed yet.
* Threads: the hooks run on autograd's thread (the caller's, for CPU);
  nothing here is meant to be called from several threads at once.
"""

import math
import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ps import _native
from ps._native import Error

# ps._native.Client's keyword arguments that init passes through.
_SETTINGS = frozenset({
    "worker_id", "connections", "compression", "shared_memory", "connect_timeout",
    "rpc_timeout", "wait_timeout", "reconnect_timeout", "heartbeat_interval", "tls_ca",
    "tls_cert", "tls_key", "tls_server_name", "job_token", "job_token_file", "identity_file",
    "log", "library",
})


class _Context:
    """The process's job: its client and, once registered, the signature."""

    def __init__(self, client: _native.Client, rank: int, num_workers: Optional[int]):
        self.client = client
        self.asked_rank = rank
        self.asked_num_workers = num_workers
        self.registration: Optional[_native.Registration] = None
        self.signature: List[Tuple[str, Tuple[int, ...]]] = []
        self.version = 0  # the version the parameters hold (= the next iteration)
        self.has_optimizer = False


_context: Optional[_Context] = None


def _require(what: str) -> _Context:
    if _context is None:
        raise Error(_native.FAILED_PRECONDITION,
                    f"ps.torch.{what}: call ps.torch.init() first")
    return _context


def _env_int(value, variable: str, what: str) -> Optional[int]:
    if value is None:
        value = os.environ.get(variable)
        if value is None or value == "":
            return None
        source = f"${variable}"
    else:
        source = what
    try:
        return int(value)
    except (TypeError, ValueError):
        raise Error(_native.INVALID_ARGUMENT,
                    f"ps.torch.init: {source} is '{value}', not an integer") from None


def init(servers: Optional[str] = None, rank: Optional[int] = None,
         num_workers: Optional[int] = None, **settings) -> None:
    """Connects this process to the job (no network yet: registration does).

    servers: "host:port" or shards' "host:port,..."; default $PS_SERVERS.
    rank: the rank to ask for; default $RANK, else any free one.
    num_workers: the job's size, checked against the server's --num_workers
    at registration; default $WORLD_SIZE, else not checked.
    settings: ps.Client's options (worker_id, connections, compression,
    shared_memory, connect_timeout, rpc_timeout, wait_timeout,
    reconnect_timeout, heartbeat_interval (seconds), tls_ca, tls_cert,
    tls_key, tls_server_name, job_token, job_token_file, identity_file, log,
    library).
    Raises ps.Error: INVALID_ARGUMENT for a missing server list, a bad
    rank or size, an unknown setting, or an option the library refuses;
    FAILED_PRECONDITION when already initialized.
    """
    global _context
    if _context is not None:
        raise Error(_native.FAILED_PRECONDITION,
                    "ps.torch.init: already initialized (ps.torch.shutdown() first)")
    unknown = sorted(set(settings) - _SETTINGS)
    if unknown:
        raise Error(_native.INVALID_ARGUMENT,
                    f"ps.torch.init: unknown setting(s) {unknown}; the settings are "
                    f"{sorted(_SETTINGS)}")
    if servers is None:
        servers = os.environ.get("PS_SERVERS", "")
    if not servers:
        raise Error(_native.INVALID_ARGUMENT,
                    "ps.torch.init: no servers: pass servers='host:port' or set $PS_SERVERS")
    rank_value = _env_int(rank, "RANK", "rank")
    size = _env_int(num_workers, "WORLD_SIZE", "num_workers")
    if rank_value is not None and rank_value < 0:
        raise Error(_native.INVALID_ARGUMENT, f"ps.torch.init: rank {rank_value} is negative")
    if size is not None and size < 1:
        raise Error(_native.INVALID_ARGUMENT, f"ps.torch.init: num_workers {size} is below 1")
    if rank_value is not None and size is not None and rank_value >= size:
        raise Error(_native.INVALID_ARGUMENT,
                    f"ps.torch.init: rank {rank_value} is not below num_workers {size}")
    client = _native.Client(servers, rank=-1 if rank_value is None else rank_value, **settings)
    _context = _Context(client, -1 if rank_value is None else rank_value, size)


def initialized() -> bool:
    """Whether init has run (and shutdown not since)."""
    return _context is not None


def shutdown() -> None:
    """Waits for pushes and pulls in flight and closes the connection; init may follow."""
    global _context
    if _context is not None:
        _context.client.close()
        _context = None


def registration() -> _native.Registration:
    """The job's settings from registration (ps.Registration)."""
    ctx = _require("registration")
    if ctx.registration is None:
        raise Error(_native.FAILED_PRECONDITION,
                    "ps.torch.registration: the model is not registered yet "
                    "(broadcast_parameters or DistributedOptimizer registers it)")
    return ctx.registration


def rank() -> int:
    """This worker's rank: the registration's, else the one init asked for."""
    ctx = _require("rank")
    if ctx.registration is not None:
        return ctx.registration.rank
    if ctx.asked_rank >= 0:
        return ctx.asked_rank
    raise Error(_native.FAILED_PRECONDITION,
                "ps.torch.rank: no rank asked for at init and the model is not registered yet")


def size() -> int:
    """The job's number of workers: the registration's, else init's."""
    ctx = _require("size")
    if ctx.registration is not None:
        return ctx.registration.num_workers
    if ctx.asked_num_workers is not None:
        return ctx.asked_num_workers
    raise Error(_native.FAILED_PRECONDITION,
                "ps.torch.size: no num_workers given at init and the model is not registered yet")


def _named_tensors(what: str, named) -> List[Tuple[str, torch.Tensor]]:
    """(name, tensor) pairs from a Module, a dict or an iterable of pairs,
    each checked: a CPU float32 tensor with a unique non-empty name."""
    if isinstance(named, torch.nn.Module):
        named = named.named_parameters()
    elif isinstance(named, dict):
        named = named.items()
    pairs = []
    seen = set()
    for i, item in enumerate(named):
        try:
            name, tensor = item
        except (TypeError, ValueError):
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: item {i} is not a (name, tensor) pair") from None
        if not isinstance(name, str) or not name:
            raise Error(_native.INVALID_ARGUMENT, f"{what}: item {i} has no name (got {name!r})")
        if name in seen:
            raise Error(_native.INVALID_ARGUMENT, f"{what}: the name '{name}' is given twice")
        seen.add(name)
        if not isinstance(tensor, torch.Tensor):
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: '{name}' is a {type(tensor).__name__}, not a tensor")
        if tensor.dtype != torch.float32:
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: parameter '{name}' is {tensor.dtype}; ps.torch takes float32 "
                        "parameters only")
        if tensor.device.type != "cpu":
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: parameter '{name}' is on {tensor.device}; ps.torch takes CPU "
                        "tensors only")
        if tensor.is_sparse:
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: parameter '{name}' is sparse; ps.torch takes dense tensors")
        pairs.append((name, tensor))
    if not pairs:
        raise Error(_native.INVALID_ARGUMENT, f"{what}: no parameters given")
    return pairs


def _first_non_finite(values: torch.Tensor) -> Optional[int]:
    """The index of values' (1-D) first NaN or infinity, or None.

    NaN and infinity carry into a sum, so a finite sum proves every element
    finite: 3.5 ms for 16.8 M floats on one thread of this 2-core machine,
    where isfinite(values).all() takes 68 ms (a bool tensor, then a
    reduction) and was a fifth of an MLP-20M step. A sum that is not finite
    (a NaN, an infinity, or finite elements that overflow together) takes
    the exact check."""
    if bool(torch.isfinite(values.sum())):
        return None
    bad = (~torch.isfinite(values)).nonzero()
    return int(bad[0, 0]) if len(bad) else None


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors]).contiguous()


def _pull_into(ctx: _Context, what: str, pairs: List[Tuple[str, torch.Tensor]]) -> None:
    """Overwrites the given (registered) tensors with the version the job is at."""
    registration_ = ctx.registration
    if registration_.optimizer == "none" and ctx.version != registration_.version:
        raise Error(_native.FAILED_PRECONDITION,
                    f"{what}: a sum-only server (--optimizer=none) holds the mean gradient at "
                    f"version {ctx.version}, not parameters: the parameters are the workers' "
                    "own after the first step")
    values = torch.empty(registration_.num_elements, dtype=torch.float32)
    ctx.client.pull_all(ctx.version, values.numpy())
    offsets = {}
    offset = 0
    for name, shape in ctx.signature:
        count = math.prod(shape)
        offsets[name] = (offset, count)
        offset += count
    with torch.no_grad():
        for name, tensor in pairs:
            start, count = offsets[name]
            tensor.copy_(values[start:start + count].view(tensor.shape))


def _register(ctx: _Context, what: str, pairs: List[Tuple[str, torch.Tensor]]) -> None:
    """Registers `pairs` as the model (rank 0's values become version 0)."""
    signature = [(name, tuple(int(d) for d in tensor.shape)) for name, tensor in pairs]
    initial = _flat([tensor for _, tensor in pairs])
    reg = ctx.client.register([(name, list(shape)) for name, shape in signature],
                              initial.numpy())
    ctx.registration = reg
    ctx.signature = signature
    ctx.version = reg.version
    if ctx.asked_num_workers is not None and reg.num_workers != ctx.asked_num_workers:
        raise Error(_native.FAILED_PRECONDITION,
                    f"{what}: the server runs {reg.num_workers} workers (--num_workers), but "
                    f"this worker was started as one of {ctx.asked_num_workers} "
                    "(num_workers or $WORLD_SIZE)")
    if reg.loss_scale != 0:
        raise Error(_native.UNIMPLEMENTED,
                    f"{what}: the server scales the loss (--loss_scale=dynamic), which ps.torch "
                    "does not do yet: start the server without it")
    if reg.optimizer not in ("sgd", "none"):
        raise Error(_native.UNIMPLEMENTED,
                    f"{what}: the server's optimizer '{reg.optimizer}' is unknown to ps.torch")
    if reg.optimizer == "none" and not reg.exact_pulls:
        raise Error(_native.FAILED_PRECONDITION,
                    f"{what}: a sum-only server under consistency '{reg.consistency}' may answer "
                    "a pull with another iteration's gradient; ps.torch needs exact pulls "
                    "(sync or ssp:0)")
    if reg.optimizer == "none" and reg.version != 0:
        raise Error(_native.FAILED_PRECONDITION,
                    f"{what}: the sum-only server's job is at version {reg.version}; it holds "
                    "that iteration's mean gradient, not the parameters, so a worker cannot "
                    "join it now")
    _pull_into(ctx, what, pairs)


def _check_registered(ctx: _Context, what: str, pairs: List[Tuple[str, torch.Tensor]],
                      whole: bool) -> None:
    """Refuses a tensor that is not a registered parameter (or, `whole`, a
    list that is not the registered signature), naming the first difference."""
    registered = dict(ctx.signature)
    for i, (name, tensor) in enumerate(pairs):
        shape = tuple(int(d) for d in tensor.shape)
        if name not in registered:
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: '{name}' is not a registered parameter (the model registered "
                        f"{len(registered)} tensors, first '{ctx.signature[0][0]}')")
        if registered[name] != shape:
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: '{name}' has shape {list(shape)}, but was registered with "
                        f"shape {list(registered[name])}")
        if whole and ctx.signature[i][0] != name:
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: tensor {i} is '{name}', but the model was registered with "
                        f"'{ctx.signature[i][0]}' there")
    if whole and len(pairs) != len(ctx.signature):
        raise Error(_native.INVALID_ARGUMENT,
                    f"{what}: {len(pairs)} tensors given, but the model was registered with "
                    f"{len(ctx.signature)} (first missing: '{ctx.signature[len(pairs)][0]}')")


def broadcast_parameters(model) -> None:
    """Sets `model`'s parameters to the version the job is at.

    model: a Module (its named_parameters), a dict or (name, tensor) pairs.
    Registers them as the model when nothing is registered yet (rank 0's
    values become version 0); afterwards each tensor must be a registered
    parameter of the same shape (ps.Error INVALID_ARGUMENT naming it).
    Blocks while registering and pulling; refused while pushes are in flight.
    """
    ctx = _require("broadcast_parameters")
    pairs = _named_tensors("ps.torch.broadcast_parameters", model)
    if ctx.registration is None:
        _register(ctx, "ps.torch.broadcast_parameters", pairs)
        return
    _check_registered(ctx, "ps.torch.broadcast_parameters", pairs, whole=False)
    _pull_into(ctx, "ps.torch.broadcast_parameters", pairs)


class _Bucket:
    """A run of segments [first, last), elements [start, end), and the
    parameters overlapping it."""

    def __init__(self, first: int, last: int, start: int, end: int, params: List[int]):
        self.first, self.last, self.start, self.end = first, last, start, end
        self.params = params
        self.pending = len(params)  # parameters still without this iteration's gradient
        self.pushed = False


class DistributedOptimizer:
    """Data-parallel training of `named_parameters` through the job's server.

    optimizer: None when the server steps the parameters (--optimizer=sgd,
    its --lr, --momentum, --weight_decay, --nesterov and schedule flags);
    a torch.optim optimizer over (some of) these parameters when the server
    is sum-only (--optimizer=none): it is applied to the pulled mean
    gradient. Either mismatch is refused at construction (ps.Error).
    named_parameters: the model's (name, parameter) pairs, in the same order
    on every worker; registered here unless broadcast_parameters did.
    bucket_bytes: about how many gradient bytes one push carries (>= 1);
    buckets are runs of the server's segments, last first (backward's order).
    observer: called as observer(event, fields) on the caller's (autograd's)
    thread, for timing and tests: "gradient" (name, iteration) when a
    parameter's gradient is copied, "push" (iteration, first, last: the
    bucket's segments) when a bucket's push starts, "step" (iteration) when
    step has applied the next version. It must not call back into the
    optimizer; what it raises propagates.
    """

    def __init__(self, optimizer: Optional[torch.optim.Optimizer], named_parameters,
                 bucket_bytes: int = 4 << 20, observer=None):
        what = "ps.torch.DistributedOptimizer"
        ctx = _require("DistributedOptimizer")
        if ctx.has_optimizer:
            raise Error(_native.FAILED_PRECONDITION,
                        f"{what}: this process already has one (one per process: its pushes "
                        "are the worker's iterations)")
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: bucket_bytes must be a positive integer, got {bucket_bytes!r}")
        pairs = _named_tensors(what, named_parameters)
        for name, tensor in pairs:
            if not tensor.requires_grad:
                raise Error(_native.INVALID_ARGUMENT,
                            f"{what}: parameter '{name}' does not require grad; give only the "
                            "parameters that train")
        if ctx.registration is None:
            _register(ctx, what, pairs)
        else:
            _check_registered(ctx, what, pairs, whole=True)
        reg = ctx.registration
        if reg.optimizer == "sgd" and optimizer is not None:
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: the server steps the parameters with its own SGD (its --lr, "
                        "--momentum, --weight_decay, --nesterov and schedule flags), so the "
                        f"local {type(optimizer).__name__} would be ignored: pass None, or start "
                        "the server with --optimizer=none to step it here")
        if reg.optimizer == "none" and optimizer is None:
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: the server is sum-only (--optimizer=none) and publishes mean "
                        "gradients: pass the torch.optim optimizer that applies them")
        if optimizer is not None:
            ids = {id(tensor) for _, tensor in pairs}
            for g, group in enumerate(optimizer.param_groups):
                for i, tensor in enumerate(group["params"]):
                    if id(tensor) not in ids:
                        raise Error(_native.INVALID_ARGUMENT,
                                    f"{what}: the optimizer's param_groups[{g}]['params'][{i}] "
                                    f"(shape {list(tensor.shape)}) is not a registered "
                                    "parameter: give every tensor it steps in named_parameters")
        self._ctx = ctx
        self._observer = observer
        self._optimizer = optimizer
        self._names = [name for name, _ in pairs]
        self._params = [tensor for _, tensor in pairs]
        self._offsets = []
        offset = 0
        for tensor in self._params:
            self._offsets.append(offset)
            offset += tensor.numel()
        self._grad = torch.zeros(offset, dtype=torch.float32)
        self._pulled = torch.zeros(offset, dtype=torch.float32)
        self._grad_buffer = self._grad.numpy()      # shares memory with the tensor
        self._pulled_buffer = self._pulled.numpy()
        self._buckets, self._param_buckets = self._plan(ctx.client.segment_ends(), bucket_bytes)
        self._samples = 1
        self._ready = [False] * len(self._params)
        self._handles: List[_native.Handle] = []
        self._check_finite = reg.loss_scale == 0
        # Hooks on each parameter's AccumulateGrad node run once p.grad holds
        # the final gradient (a hook on the tensor would run before it is
        # accumulated). The nodes are kept alive here, as Horovod does.
        self._grad_accumulators = []
        for index, tensor in enumerate(self._params):
            accumulator = tensor.expand_as(tensor).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_hook(index))
            self._grad_accumulators.append(accumulator)
        ctx.has_optimizer = True

    def _plan(self, ends: List[int], bucket_bytes: int):
        buckets: List[_Bucket] = []
        last = len(ends)
        while last > 0:
            first = last - 1
            end = ends[last - 1]
            while first > 0 and (end - ends[first - 1]) * 4 < bucket_bytes:
                first -= 1
            start = ends[first - 1] if first > 0 else 0
            params = [i for i, tensor in enumerate(self._params)
                      if self._offsets[i] < end and self._offsets[i] + tensor.numel() > start]
            buckets.append(_Bucket(first, last, start, end, params))
            last = first
        param_buckets = [[] for _ in self._params]
        for b, bucket in enumerate(buckets):
            for i in bucket.params:
                param_buckets[i].append(b)
        return buckets, param_buckets

    def _make_hook(self, index: int):
        def hook(*_unused):
            self._on_gradient(index)
        return hook

    @property
    def iteration(self) -> int:
        """The iteration being computed (= the version the parameters hold)."""
        return self._ctx.version

    @property
    def param_groups(self):
        """The local optimizer's param_groups (for LR schedulers); [] without one."""
        return self._optimizer.param_groups if self._optimizer is not None else []

    def _in_flight(self) -> bool:
        return any(bucket.pushed for bucket in self._buckets)

    def set_samples(self, num_samples: int) -> None:
        """This worker's sample count for the pushes from now on (>= 0).

        Set before backward; it stays until set again. Refused (ps.Error
        FAILED_PRECONDITION) while this iteration's pushes are under way
        with another count.
        """
        if not isinstance(num_samples, int) or num_samples < 0:
            raise Error(_native.INVALID_ARGUMENT,
                        f"set_samples: the sample count must be an integer >= 0, got "
                        f"{num_samples!r}")
        if num_samples != self._samples and self._in_flight():
            raise Error(_native.FAILED_PRECONDITION,
                        f"set_samples({num_samples}): iteration {self.iteration}'s buckets are "
                        f"already pushed with {self._samples} samples; call it before backward")
        self._samples = num_samples

    def _on_gradient(self, index: int) -> None:
        name = self._names[index]
        if self._ready[index]:
            raise Error(_native.FAILED_PRECONDITION,
                        f"parameter '{name}' got a second gradient in iteration "
                        f"{self.iteration}: one backward per step() (gradient accumulation "
                        "over several backward passes is not supported)")
        tensor = self._params[index]
        grad = tensor.grad
        start = self._offsets[index]
        out = self._grad[start:start + tensor.numel()]
        if grad is None:
            out.zero_()
        else:
            if grad.is_sparse:
                raise Error(_native.INVALID_ARGUMENT,
                            f"parameter '{name}' has a sparse gradient; ps.torch takes dense ones")
            torch.mul(grad.reshape(-1), self._samples, out=out)
            bad = _first_non_finite(out) if self._check_finite else None
            if bad is not None:
                raise Error(_native.INVALID_ARGUMENT,
                            f"parameter '{name}' has a non-finite gradient "
                            f"({float(grad.reshape(-1)[bad])} at element {bad}) in iteration "
                            f"{self.iteration}; refused before pushing it")
        self._ready[index] = True
        if self._observer is not None:
            self._observer("gradient", {"name": name, "iteration": self.iteration})
        for b in self._param_buckets[index]:
            bucket = self._buckets[b]
            bucket.pending -= 1
            if bucket.pending == 0:
                self._push(bucket)

    def _push(self, bucket: _Bucket) -> None:
        client = self._ctx.client
        t = self.iteration
        bucket.pushed = True
        if self._observer is not None:
            self._observer("push", {"iteration": t, "first": bucket.first, "last": bucket.last})
        self._handles.append(client.push(t, self._samples, bucket.first, bucket.last,
                                         self._grad_buffer))
        self._handles.append(client.pull(t + 1, bucket.first, bucket.last,
                                         self._pulled_buffer))

    def step(self, closure=None, num_samples: Optional[int] = None) -> None:
        """Pushes what backward left, waits for the next version and applies it.

        Server SGD: the pulled parameters are copied into the model.
        Sum-only server: the pulled mean gradient is written into each
        parameter's .grad and the local optimizer steps. A parameter that got
        no gradient in this iteration contributes zeros. num_samples: see the
        module's contract. Raises the first failed push's or pull's ps.Error
        (after all have ended); the iteration is then lost (reconnect is not
        handled here yet).
        """
        if closure is not None:
            raise Error(_native.UNIMPLEMENTED,
                        "step: closures (re-evaluating the loss) are not supported")
        if num_samples is not None and num_samples != self._samples:
            if self._in_flight():
                raise Error(_native.FAILED_PRECONDITION,
                            f"step(num_samples={num_samples}): iteration {self.iteration}'s "
                            f"buckets were pushed during backward with {self._samples} samples; "
                            f"call set_samples({num_samples}) before backward")
            self.set_samples(num_samples)
        for index, ready in enumerate(self._ready):
            if not ready:
                start = self._offsets[index]
                self._grad[start:start + self._params[index].numel()].zero_()
                self._ready[index] = True
        for bucket in self._buckets:
            if not bucket.pushed:
                self._push(bucket)
        handles, self._handles = self._handles, []
        first_error = None
        for handle in handles:
            try:
                handle.wait()
            except Error as e:
                first_error = first_error or e
            finally:
                handle.close()
        if first_error is not None:
            raise first_error
        with torch.no_grad():
            for index, tensor in enumerate(self._params):
                start = self._offsets[index]
                pulled = self._pulled[start:start + tensor.numel()].view(tensor.shape)
                if self._optimizer is None:
                    tensor.copy_(pulled)
                elif tensor.grad is None:
                    tensor.grad = pulled.clone()
                else:
                    tensor.grad.copy_(pulled)
        if self._optimizer is not None:
            self._optimizer.step()
        self._ctx.version += 1
        self._ready = [False] * len(self._params)
        for bucket in self._buckets:
            bucket.pending = len(bucket.params)
            bucket.pushed = False
        if self._observer is not None:
            self._observer("step", {"iteration": self._ctx.version - 1})

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Clears the parameters' gradients; refused while pushes are in flight."""
        if self._in_flight():
            raise Error(_native.FAILED_PRECONDITION,
                        f"zero_grad: iteration {self.iteration}'s gradients are being pushed; "
                        "call step() first")
        if self._optimizer is not None:
            self._optimizer.zero_grad(set_to_none=set_to_none)
            return
        for tensor in self._params:
            if tensor.grad is None:
                continue
            if set_to_none:
                tensor.grad = None
            else:
                tensor.grad.detach_()
                tensor.grad.zero_()

    def state_dict(self) -> dict:
        """The local optimizer's state ({} without one: the server holds SGD's)."""
        return self._optimizer.state_dict() if self._optimizer is not None else {}

    def load_state_dict(self, state: dict) -> None:
        """Loads the local optimizer's state."""
        if self._optimizer is None:
            raise Error(_native.FAILED_PRECONDITION,
                        "load_state_dict: the server's SGD holds the optimizer state "
                        "(its checkpoints)")
        self._optimizer.load_state_dict(state)
