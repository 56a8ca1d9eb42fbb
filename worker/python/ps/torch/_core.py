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
* Parameters are dense float32 tensors that require grad, on the CPU or on
  CUDA (one device per model); anything else is refused naming the tensor.
* One DistributedOptimizer per process, one backward per step and replica:
  once a parameter's AccumulateGrad node has run in every local replica,
  its gradients (each times its replica's sample count, summed in replica
  order) go into a flat float32 host buffer (for CUDA, summed on the first
  replica's device and copied into pinned memory on a side stream), and a
  bucket of the server's segments is pushed as soon as every parameter
  overlapping it is there, while backward goes on. step() pushes what is
  left, waits for the next version and copies it into every replica.
* Sample counts: pushes carry gradient sums, so each worker's mean gradient
  is multiplied by its sample count. The count is needed while backward
  pushes, so it is set before backward: set_samples(n) (it stays until set
  again). The default, 1, is the equal-parts convention: each worker's loss
  is the mean over an equal part of the global batch, and the server's mean
  of the workers' means is the global batch's mean gradient.
  step(num_samples=n) states the count of the iteration just computed: it
  must equal the count the pushes used (ps.Error otherwise, pointing at
  set_samples), unless nothing was pushed yet. With local replicas the
  count is a list, one per replica; the push carries their sum.
* A lost server (ps.Error.server_lost): with recover (the default) step()
  reconnects, loads the version the server resumed at and returns; the
  caller's loop takes `iteration` as its data position.
* Threads: the hooks run on autograd's threads (the caller's for CPU, one
  per device for CUDA; a lock orders them); CUDA buckets are pushed from
  one push thread. The public calls are meant for one thread.
"""

import bisect
import math
import os
import queue
import threading
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
        # Version 0's values when this worker registered at version 0: what
        # a reconnect proposes to a server that comes back without any
        # state, as the C++ worker does (then everyone restarts from 0).
        self.initial: Optional[torch.Tensor] = None
        self.on_shutdown: List = []  # callables shutdown() runs first (the push thread's stop)


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
        for stop in _context.on_shutdown:
            stop()
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


def _check_device(what: str, which: str, device: torch.device) -> None:
    """Refuses a device ps.torch does not train on: CPU and CUDA only, CUDA
    only where this process sees it."""
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise Error(_native.INVALID_ARGUMENT,
                    f"{what}: {which} is on {device}; ps.torch takes CPU and CUDA tensors")
    if not torch.cuda.is_available():
        raise Error(_native.FAILED_PRECONDITION,
                    f"{what}: {which} is on {device}, but CUDA is not available to this process")


def _named_tensors(what: str, named) -> List[Tuple[str, torch.Tensor]]:
    """(name, tensor) pairs from a Module, a dict or an iterable of pairs,
    each checked: a dense float32 CPU or CUDA tensor with a unique non-empty name."""
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
        _check_device(what, f"parameter '{name}'", tensor.device)
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
    return torch.cat([t.detach().reshape(-1).cpu() for t in tensors]).contiguous()


def _pull_into(ctx: _Context, what: str, pairs: List[Tuple[str, torch.Tensor]]) -> torch.Tensor:
    """Overwrites the given (registered) tensors with the version the job is
    at; returns that whole version (flat)."""
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
    return values


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
    values = _pull_into(ctx, what, pairs)
    if reg.version == 0:
        ctx.initial = values


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


def _weighted_sum(out: torch.Tensor, terms: List[Tuple[torch.Tensor, int]]) -> None:
    """out = the sum of count x gradient over terms, in their order (replica
    order, so every run adds alike); zeros when there is none. Gradients on
    another device than out's are copied there first."""
    if not terms:
        out.zero_()
        return
    for k, (grad, count) in enumerate(terms):
        flat = grad.reshape(-1)
        if flat.device != out.device:
            flat = flat.to(out.device)
        if k == 0:
            torch.mul(flat, count, out=out)
        else:
            out.add_(flat, alpha=count)


class _PushThread:
    """Starts the pushes of buckets whose gradients are still being copied
    off the GPU: for each bucket, in submission order, calls wait() (the
    copy's event: the host waits for that copy only, never for the whole
    device), then start_push(bucket).

    A thread, so that autograd's device thread launches the rest of backward
    instead of waiting for copies. The first exception (a non-finite
    gradient, a CUDA error) is kept and the buckets after it are dropped
    until drain() hands it over. submit() may be called from any thread;
    drain() and stop() from one (step()'s and shutdown()'s).
    """

    def __init__(self, start_push):
        self._start_push = start_push
        self._queue: "queue.Queue" = queue.Queue()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="ps.torch push", daemon=True)
        self._thread.start()

    def submit(self, bucket, wait) -> None:
        self._queue.put((bucket, wait))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                bucket, wait = item
                if self._error is None:
                    wait()
                    self._start_push(bucket)
            except BaseException as e:  # kept for step(); the thread goes on
                self._error = e
            finally:
                self._queue.task_done()

    def drain(self) -> Optional[BaseException]:
        """Waits until every bucket submitted is pushed or dropped; returns the
        first exception since the last drain, or None."""
        self._queue.join()
        error, self._error = self._error, None
        return error

    def stop(self) -> None:
        """Ends the thread once what was submitted is done."""
        self._queue.put(None)
        self._thread.join()


class _CudaPipeline:
    """The device side of a step whose replicas are on CUDA devices.

    Gradients: once every replica has parameter i's gradient, they are summed
    (each times its replica's sample count, in replica order) into a flat
    float32 buffer on the first replica's device, on that device's current
    (compute) stream. A side (copy) stream waits for an event recorded after
    the sum and copies it into the pinned host buffer the push reads. When a
    bucket's last parameter is copied, an event recorded on the copy stream
    goes with the bucket to the push thread, which waits for that event
    alone and pushes.
    Parameters (or a sum-only server's mean gradient): each device's copy
    stream first waits for the device's current stream (backward may still
    read the parameters there), copies from the pinned host buffer
    (non_blocking), and the host waits for those copy streams before step()
    returns, so the next forward reads the new values.
    Called with the optimizer's lock held (reduce, submit), or from step().
    `cuda`: torch.cuda, or a stand-in with its Stream, Event, current_stream
    and stream (the test drives this host logic on CPU tensors with no-op
    streams where no GPU is).
    """

    def __init__(self, devices: List[torch.device], num_elements: int, start_push,
                 cuda=torch.cuda):
        self._cuda = cuda
        self.first = devices[0]
        self.device_grad = torch.zeros(num_elements, dtype=torch.float32, device=self.first)
        self.copy_streams = {device: cuda.Stream(device=device) for device in devices}
        self.push_thread = _PushThread(start_push)

    def reduce(self, start: int, terms: List[Tuple[torch.Tensor, int]],
               host_out: torch.Tensor) -> None:
        cuda = self._cuda
        summed = self.device_grad[start:start + host_out.numel()]
        compute = cuda.current_stream(self.first)
        with cuda.stream(compute):
            _weighted_sum(summed, terms)
            done = cuda.Event()
            done.record(compute)
        copy = self.copy_streams[self.first]
        copy.wait_event(done)
        with cuda.stream(copy):
            host_out.copy_(summed, non_blocking=True)

    def submit(self, buckets: List[_Bucket]) -> None:
        """Hands buckets to the push thread behind the copies issued so far."""
        # blocking: the push thread sleeps in the driver until the copy is
        # done, instead of spinning a core that backward's CPU side needs.
        copied = self._cuda.Event(blocking=True)
        copied.record(self.copy_streams[self.first])
        for bucket in buckets:
            self.push_thread.submit(bucket, copied.synchronize)

    def load(self, copies: List[Tuple[torch.Tensor, torch.Tensor]]) -> None:
        """copies: (device tensor, pinned host tensor of its shape) pairs."""
        cuda = self._cuda
        for device, stream in self.copy_streams.items():
            stream.wait_stream(cuda.current_stream(device))
        with torch.no_grad():
            for target, source in copies:
                with cuda.stream(self.copy_streams[target.device]):
                    target.copy_(source, non_blocking=True)
        for stream in self.copy_streams.values():
            stream.synchronize()


def _replica_parameters(what: str, pairs: List[Tuple[str, torch.Tensor]],
                        replicas) -> List[List[torch.Tensor]]:
    """Each replica's tensors for the names of `pairs`, in that order; the
    first replica's are pairs' own. Refuses (ps.Error INVALID_ARGUMENT) a
    replica that is not a Module, lacks a name, has another shape or dtype,
    or shares a tensor with another replica."""
    tensors = [tensor for _, tensor in pairs]
    if replicas is None:
        return [tensors]
    if isinstance(replicas, torch.nn.Module) or not isinstance(replicas, (list, tuple)) \
            or not replicas:
        raise Error(_native.INVALID_ARGUMENT,
                    f"{what}: replicas must be a non-empty list of Modules, one per local "
                    "device, the first being the model named_parameters comes from")
    rows = []
    owners = {}  # id(tensor) -> (replica, name): a tensor belongs to one replica
    for r, replica in enumerate(replicas):
        if not isinstance(replica, torch.nn.Module):
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: replicas[{r}] is a {type(replica).__name__}, not a "
                        "torch.nn.Module")
        own = dict(replica.named_parameters())
        row = []
        for name, first in pairs:
            tensor = own.get(name)
            if tensor is None:
                raise Error(_native.INVALID_ARGUMENT,
                            f"{what}: replicas[{r}] has no parameter '{name}': the replicas "
                            "are copies of one model (copy.deepcopy(model).to(device))")
            if r == 0 and tensor is not first:
                raise Error(_native.INVALID_ARGUMENT,
                            f"{what}: replicas[0]'s '{name}' is not the tensor named_parameters "
                            "gave: pass replicas[0].named_parameters()")
            if tensor.shape != first.shape:
                raise Error(_native.INVALID_ARGUMENT,
                            f"{what}: replicas[{r}]'s '{name}' has shape {list(tensor.shape)}, "
                            f"but replicas[0]'s has {list(first.shape)}")
            if tensor.dtype != torch.float32 or tensor.is_sparse or not tensor.requires_grad:
                raise Error(_native.INVALID_ARGUMENT,
                            f"{what}: replicas[{r}]'s '{name}' is not a dense float32 tensor "
                            f"that requires grad ({tensor.dtype}, sparse: {tensor.is_sparse}, "
                            f"requires_grad: {tensor.requires_grad}), as replicas[0]'s is")
            if id(tensor) in owners:
                other, other_name = owners[id(tensor)]
                raise Error(_native.INVALID_ARGUMENT,
                            f"{what}: replicas[{r}]'s '{name}' is the same tensor as "
                            f"replicas[{other}]'s '{other_name}': each replica needs its own "
                            "parameters (copy.deepcopy(model).to(device))")
            owners[id(tensor)] = (r, name)
            row.append(tensor)
        rows.append(row)
    return rows


def _replica_devices(what: str, names: List[str],
                     replica_params: List[List[torch.Tensor]]) -> List[torch.device]:
    """The device of each replica: all its parameters on one device, and the
    replicas all on the CPU or all on CUDA devices (ps.Error otherwise)."""
    devices = []
    for r, params in enumerate(replica_params):
        where = f" of replicas[{r}]" if len(replica_params) > 1 else ""
        device = params[0].device
        for name, tensor in zip(names, params):
            _check_device(what, f"parameter '{name}'{where}", tensor.device)
            if tensor.device != device:
                raise Error(_native.INVALID_ARGUMENT,
                            f"{what}: parameter '{names[0]}'{where} is on {device} but "
                            f"'{name}' on {tensor.device}: a model (each replica) lives on one "
                            "device")
        devices.append(device)
    for r, device in enumerate(devices):
        if device.type != devices[0].type:
            raise Error(_native.INVALID_ARGUMENT,
                        f"{what}: replicas[0] is on {devices[0]} but replicas[{r}] on {device}: "
                        "the replicas are all on the CPU or all on CUDA devices")
    return devices


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
    observer: called as observer(event, fields), for timing and tests:
    "gradient" (name, iteration) when a parameter's gradient (summed over
    the replicas) is ready, "push" (iteration, first, last: the bucket's
    segments) when a bucket's push starts, "step" (iteration) when step has
    applied the next version, "recovered" (iteration: the one lost,
    version: the one resumed at) after a reconnect. It runs on autograd's
    thread, on ps.torch's push thread ("push" with CUDA replicas) or on the
    caller's (step); it must not call back into the optimizer; what it
    raises propagates (from the push thread: out of step()).
    replicas: None, or this process's local replicas of the model, one per
    device (Modules with the same parameter names and shapes), the first
    being the model named_parameters comes from: each trains on its part of
    the worker's batch, their gradients are summed locally and pushed once,
    and the pulled version is copied into every replica. All on the CPU or
    all on CUDA devices; each replica's parameters on one device.
    recover: when a push or pull fails because the server went away or
    restarted (ps.Error.server_lost), step() reconnects (waiting up to
    init's reconnect_timeout), loads the version the server resumed at
    (possibly older: a server restarted from its checkpoint) and returns;
    `iteration` then says which iteration comes next. False: step() raises
    the error. A sum-only server's loss is raised either way.
    """

    def __init__(self, optimizer: Optional[torch.optim.Optimizer], named_parameters,
                 bucket_bytes: int = 4 << 20, observer=None, replicas=None,
                 recover: bool = True):
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
        names = [name for name, _ in pairs]
        replica_params = _replica_parameters(what, pairs, replicas)
        devices = _replica_devices(what, names, replica_params)
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
        # Every replica starts from the job's version, which the first holds now.
        with torch.no_grad():
            for params in replica_params[1:]:
                for tensor, first in zip(params, replica_params[0]):
                    tensor.copy_(first)
        self._ctx = ctx
        self._observer = observer
        self._optimizer = optimizer
        self._recover = bool(recover)
        self.recoveries = 0  # how many times step() reconnected and went on
        self._names = names
        self._replicas = replica_params
        self._params = replica_params[0]
        self._offsets = []
        offset = 0
        for tensor in self._params:
            self._offsets.append(offset)
            offset += tensor.numel()
        on_cuda = devices[0].type == "cuda"
        # Pinned host buffers for CUDA replicas: the copies to and from the
        # devices run asynchronously only from and into page-locked memory.
        self._grad = torch.zeros(offset, dtype=torch.float32, pin_memory=on_cuda)
        self._pulled = torch.zeros(offset, dtype=torch.float32, pin_memory=on_cuda)
        self._grad_buffer = self._grad.numpy()      # shares memory with the tensor
        self._pulled_buffer = self._pulled.numpy()
        self._bucket_bytes = bucket_bytes
        self._buckets, self._param_buckets = self._plan(ctx.client.segment_ends(), bucket_bytes)
        self._samples = [1] * len(replica_params)
        self._lock = threading.Lock()  # hooks may run on several device threads at once
        self._reset_iteration()
        self._check_finite = reg.loss_scale == 0
        self._cuda = _CudaPipeline(devices, offset, self._push) if on_cuda else None
        if self._cuda is not None:
            ctx.on_shutdown.append(self._cuda.push_thread.stop)
        # Hooks on each parameter's AccumulateGrad node run once p.grad holds
        # the final gradient (a hook on the tensor would run before it is
        # accumulated). The nodes are kept alive here, as Horovod does.
        self._grad_accumulators = []
        for r, params in enumerate(replica_params):
            for index, tensor in enumerate(params):
                accumulator = tensor.expand_as(tensor).grad_fn.next_functions[0][0]
                accumulator.register_hook(self._make_hook(r, index))
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

    def _reset_iteration(self) -> None:
        """Nothing of the next iteration computed or pushed yet."""
        count = len(self._params)
        self._arrived = [[False] * count for _ in self._replicas]  # [replica][parameter]
        self._ready = [False] * count  # the parameter's sum is in the host buffer (or on its way)
        for bucket in self._buckets:
            bucket.pending = len(bucket.params)
            bucket.pushed = False
        self._handles: List[_native.Handle] = []
        self._failures: List[Error] = []  # pushes or pulls that could not start

    def _make_hook(self, replica: int, index: int):
        def hook(*_unused):
            self._on_gradient(replica, index)
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

    def _sample_counts(self, num_samples, what: str) -> List[int]:
        """One count per replica from an integer (one replica) or a sequence."""
        replicas = len(self._replicas)
        if isinstance(num_samples, int) and not isinstance(num_samples, bool):
            if replicas > 1:
                raise Error(_native.INVALID_ARGUMENT,
                            f"{what}: with {replicas} replicas give one sample count per "
                            f"replica (a list of {replicas} integers), got {num_samples!r}")
            counts = [num_samples]
        elif isinstance(num_samples, (list, tuple)):
            counts = list(num_samples)
            if len(counts) != replicas:
                raise Error(_native.INVALID_ARGUMENT,
                            f"{what}: {len(counts)} sample counts for {replicas} replicas")
        else:
            counts = [num_samples]
        for count in counts:
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise Error(_native.INVALID_ARGUMENT,
                            f"{what}: the sample count must be an integer >= 0, got {count!r}")
        return counts

    def set_samples(self, num_samples) -> None:
        """This worker's sample count for the pushes from now on.

        An integer >= 0; with replicas, a list of one count per replica (the
        push carries their sum). Set before backward; it stays until set
        again. Refused (ps.Error FAILED_PRECONDITION) while this iteration's
        pushes are under way with other counts.
        """
        what = f"set_samples({num_samples!r})"
        counts = self._sample_counts(num_samples, "set_samples")
        if counts != self._samples and self._in_flight():
            raise Error(_native.FAILED_PRECONDITION,
                        f"{what}: iteration {self.iteration}'s buckets are already pushed with "
                        f"{self._shown_samples()} samples; call it before backward")
        self._samples = counts

    def _shown_samples(self):
        return self._samples[0] if len(self._samples) == 1 else self._samples

    def _on_gradient(self, replica: int, index: int) -> None:
        with self._lock:
            name = self._names[index]
            if self._arrived[replica][index] or self._ready[index]:
                of = f" of replicas[{replica}]" if len(self._replicas) > 1 else ""
                raise Error(_native.FAILED_PRECONDITION,
                            f"parameter '{name}'{of} got a second gradient in iteration "
                            f"{self.iteration}: one backward per step() (gradient accumulation "
                            "over several backward passes is not supported)")
            self._arrived[replica][index] = True
            if all(arrived[index] for arrived in self._arrived):
                self._parameter_ready(index)

    def _parameter_ready(self, index: int) -> None:
        """Sums parameter `index`'s gradients over the replicas that have one
        into the host buffer (or starts that on the device) and pushes the
        buckets it completes. Lock held."""
        name = self._names[index]
        terms = []
        for r, params in enumerate(self._replicas):
            grad = params[index].grad
            if not self._arrived[r][index] or grad is None:
                continue
            if grad.is_sparse:
                raise Error(_native.INVALID_ARGUMENT,
                            f"parameter '{name}' has a sparse gradient; ps.torch takes dense ones")
            terms.append((grad, self._samples[r]))
        start = self._offsets[index]
        out = self._grad[start:start + self._params[index].numel()]
        if self._cuda is not None:
            self._cuda.reduce(start, terms, out)  # checked finite on the host, before its push
        else:
            _weighted_sum(out, terms)
            bad = _first_non_finite(out) if self._check_finite and terms else None
            if bad is not None:
                # The gradient's own value where one is not finite; else
                # finite values overflowed when scaled and summed.
                values = [float(grad.reshape(-1)[bad]) for grad, _ in terms]
                value = next((v for v in values if not math.isfinite(v)), float(out[bad]))
                raise Error(_native.INVALID_ARGUMENT,
                            f"parameter '{name}' has a non-finite gradient "
                            f"({value} at element {bad}) in iteration "
                            f"{self.iteration}; refused before pushing it")
        self._ready[index] = True
        if self._observer is not None:
            self._observer("gradient", {"name": name, "iteration": self.iteration})
        complete = []
        for b in self._param_buckets[index]:
            bucket = self._buckets[b]
            bucket.pending -= 1
            if bucket.pending == 0:
                complete.append(bucket)
        if self._cuda is not None:
            for bucket in complete:
                bucket.pushed = True
            if complete:
                self._cuda.submit(complete)
        else:
            for bucket in complete:
                self._push(bucket)

    def _push(self, bucket: _Bucket) -> None:
        """Starts the bucket's push and the pull of its next version. A call
        that fails to start is kept for step()."""
        client = self._ctx.client
        t = self.iteration
        bucket.pushed = True
        if self._cuda is not None and self._check_finite:
            bad = _first_non_finite(self._grad[bucket.start:bucket.end])
            if bad is not None:
                element = bucket.start + bad
                index = bisect.bisect_right(self._offsets, element) - 1
                raise Error(_native.INVALID_ARGUMENT,
                            f"parameter '{self._names[index]}' has a non-finite gradient "
                            f"({float(self._grad[element])} at element "
                            f"{element - self._offsets[index]}) in iteration {t}; refused "
                            "before pushing it")
        if self._observer is not None:
            self._observer("push", {"iteration": t, "first": bucket.first, "last": bucket.last})
        try:
            self._handles.append(client.push(t, sum(self._samples), bucket.first, bucket.last,
                                             self._grad_buffer))
            self._handles.append(client.pull(t + 1, bucket.first, bucket.last,
                                             self._pulled_buffer))
        except Error as e:
            self._failures.append(e)

    def _load_pulled(self) -> None:
        """The pulled version into every replica's parameters (server SGD)."""
        copies = []
        for params in self._replicas:
            for index, tensor in enumerate(params):
                start = self._offsets[index]
                copies.append((tensor, self._pulled[start:start + tensor.numel()]
                               .view(tensor.shape)))
        self._copy_in(copies)

    def _copy_in(self, copies: List[Tuple[torch.Tensor, torch.Tensor]]) -> None:
        if self._cuda is not None:
            self._cuda.load(copies)
            return
        with torch.no_grad():
            for target, source in copies:
                target.copy_(source)

    def step(self, closure=None, num_samples=None) -> None:
        """Pushes what backward left, waits for the next version and applies it.

        Server SGD: the pulled parameters are copied into the model (every
        replica). Sum-only server: the pulled mean gradient is written into
        each parameter's .grad, the local optimizer steps, and the other
        replicas take the first one's parameters. A parameter that got no
        gradient in this iteration contributes zeros. num_samples: see the
        module's contract. Once every push and pull has ended, raises the
        first failure's ps.Error, except a lost server when `recover` is on:
        then it reconnects, loads the version the server resumed at and
        returns (self.iteration says which comes next).
        """
        if closure is not None:
            raise Error(_native.UNIMPLEMENTED,
                        "step: closures (re-evaluating the loss) are not supported")
        if num_samples is not None:
            counts = self._sample_counts(num_samples, "step")
            if counts != self._samples:
                if self._in_flight():
                    raise Error(_native.FAILED_PRECONDITION,
                                f"step(num_samples={num_samples!r}): iteration "
                                f"{self.iteration}'s buckets were pushed during backward with "
                                f"{self._shown_samples()} samples; call "
                                f"set_samples({num_samples!r}) before backward")
                self._samples = counts
        with self._lock:
            for index, ready in enumerate(self._ready):
                if not ready:
                    self._parameter_ready(index)  # replicas without a gradient: zeros
        failures = []
        if self._cuda is not None:
            error = self._cuda.push_thread.drain()
            if error is not None:
                failures.append(error)
        handles, self._handles = self._handles, []
        for handle in handles:
            try:
                handle.wait()
            except Error as e:
                failures.append(e)
            finally:
                handle.close()
        failures += self._failures
        if failures:
            first = failures[0]
            if self._recover and isinstance(first, Error) and first.server_lost:
                self._reconnect(first)
                return
            raise first
        if self._optimizer is None:
            self._load_pulled()
        else:
            copies = []
            for index, tensor in enumerate(self._params):
                if tensor.grad is None:
                    tensor.grad = torch.zeros_like(tensor)
                start = self._offsets[index]
                copies.append((tensor.grad,
                               self._pulled[start:start + tensor.numel()].view(tensor.shape)))
            self._copy_in(copies)
            self._optimizer.step()
            with torch.no_grad():
                for params in self._replicas[1:]:
                    for tensor, first in zip(params, self._params):
                        tensor.copy_(first)
        self._ctx.version += 1
        self._reset_iteration()
        if self._observer is not None:
            self._observer("step", {"iteration": self._ctx.version - 1})

    def _reconnect(self, lost: Error) -> None:
        """After a lost server: registers again, loads the version it has and
        starts that iteration afresh. Raises ps.Error when it cannot."""
        ctx = self._ctx
        t = self.iteration
        self._reset_iteration()
        if ctx.registration.optimizer == "none":
            raise Error(lost.code,
                        f"step: the server was lost in iteration {t} ({lost.message}); a "
                        "sum-only server (--optimizer=none) keeps mean gradients, not the "
                        "parameters, so ps.torch cannot resume from it: restart the job") \
                from lost
        initial = None if ctx.initial is None else ctx.initial.numpy()
        before = ctx.registration
        while True:
            registered = False
            try:
                reg = ctx.client.reconnect(initial)  # waits up to reconnect_timeout
                registered = True
                pulled = ctx.client.pull_all(reg.version, self._pulled_buffer)
                break
            except Error as e:
                if e.server_lost and registered:
                    continue  # lost again after registering: reconnect waits for it again
                raise Error(e.code,
                            f"step: the server was lost in iteration {t} ({lost.message}) and "
                            f"reconnecting failed: {e.message}") from lost
        if (reg.rank, reg.num_workers) != (before.rank, before.num_workers):
            raise Error(_native.FAILED_PRECONDITION,
                        f"step: the server came back with this worker as rank {reg.rank} of "
                        f"{reg.num_workers} workers; it was rank {before.rank} of "
                        f"{before.num_workers} (lost in iteration {t}: {lost.message})")
        ctx.registration = reg
        self._buckets, self._param_buckets = self._plan(ctx.client.segment_ends(),
                                                        self._bucket_bytes)
        self._reset_iteration()
        self._load_pulled()
        ctx.version = pulled
        self.recoveries += 1
        if self._observer is not None:
            self._observer("recovered", {"iteration": t, "version": pulled})

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Clears every replica's gradients; refused while pushes are in flight."""
        if self._in_flight():
            raise Error(_native.FAILED_PRECONDITION,
                        f"zero_grad: iteration {self.iteration}'s gradients are being pushed; "
                        "call step() first")
        replicas = self._replicas
        if self._optimizer is not None:
            self._optimizer.zero_grad(set_to_none=set_to_none)
            replicas = replicas[1:]
        for params in replicas:
            for tensor in params:
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
