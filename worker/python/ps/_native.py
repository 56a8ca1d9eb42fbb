"""A thin ctypes binding of libps_client.so (worker/client/ps_client.h).

One class per C handle (Client, Handle), one method per C call, the C
contracts unchanged (docs/client.md): every failure raises ps.Error with the
call's code and message; buffers are passed without copies. Nothing here
knows PyTorch: ps.torch builds on it. Pure Python over ctypes, so one build
of the library serves every Python and torch version.

The library is found at $PS_CLIENT_LIBRARY when set, else next to this file
(where `bazel build //worker/python:ps` puts it).

Buffers: a flat float32 array of the model's size, C-contiguous, exposing
the buffer protocol (numpy arrays, array.array('f'), torch CPU tensors'
.numpy()). The library reads a pushed buffer and writes a pulled one from
its own threads until the Handle is done; the Handle keeps a reference to
the buffer until then, and the caller leaves those segments alone.

Calls release the GIL while they run (ctypes.CDLL), so other Python threads
go on during a blocking call or a wait.
"""

import ctypes
import dataclasses
import os
import threading
from typing import Callable, List, Optional, Sequence, Tuple

# The ABI this binding is written for: ps_client.h's PS_CLIENT_ABI_VERSION.
ABI_VERSION = 2

_ERROR_MESSAGE_SIZE = 2048
_CONSISTENCY_SIZE = 32
_OPTIMIZER_SIZE = 16

DTYPE_F32 = 0
DTYPE_F16 = 1
DTYPE_BF16 = 2
DTYPE_I32 = 3
DTYPE_I64 = 4
_DTYPES = {"float32": DTYPE_F32, "f32": DTYPE_F32, "F32": DTYPE_F32,
           "float16": DTYPE_F16, "f16": DTYPE_F16, "F16": DTYPE_F16,
           "bfloat16": DTYPE_BF16, "bf16": DTYPE_BF16, "BF16": DTYPE_BF16,
           "int32": DTYPE_I32, "I32": DTYPE_I32,
           "int64": DTYPE_I64, "I64": DTYPE_I64}

# absl's canonical codes, as ps_client.h numbers them.
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16
_CODE_NAMES = {
    OK: "OK", CANCELLED: "CANCELLED", UNKNOWN: "UNKNOWN",
    INVALID_ARGUMENT: "INVALID_ARGUMENT", DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
    NOT_FOUND: "NOT_FOUND", ALREADY_EXISTS: "ALREADY_EXISTS",
    PERMISSION_DENIED: "PERMISSION_DENIED", RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
    FAILED_PRECONDITION: "FAILED_PRECONDITION", ABORTED: "ABORTED",
    OUT_OF_RANGE: "OUT_OF_RANGE", UNIMPLEMENTED: "UNIMPLEMENTED", INTERNAL: "INTERNAL",
    UNAVAILABLE: "UNAVAILABLE", DATA_LOSS: "DATA_LOSS", UNAUTHENTICATED: "UNAUTHENTICATED",
}
# The codes after which reconnect (rather than failing) is the answer: the
# server went away or restarted (worker/parameter_store.h, IsServerLost).
SERVER_LOST = frozenset({UNAVAILABLE, CANCELLED, ABORTED})


class Error(Exception):
    """A failed call: `code` (absl's canonical code), `code_name`, `message`."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.code_name = _CODE_NAMES.get(code, "UNKNOWN_CODE")
        self.message = message
        super().__init__(f"{self.code_name}: {message}")

    @property
    def server_lost(self) -> bool:
        """Whether the server went away or restarted: Client.reconnect."""
        return self.code in SERVER_LOST


class _Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int32), ("message", ctypes.c_char * _ERROR_MESSAGE_SIZE)]


_LogFunction = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)


class _Options(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_int32),
        ("servers", ctypes.c_char_p),
        ("worker_id", ctypes.c_char_p),
        ("rank", ctypes.c_int32),
        ("connections", ctypes.c_int32),
        ("compression", ctypes.c_char_p),
        ("shared_memory", ctypes.c_int32),
        ("connect_timeout_ms", ctypes.c_int64),
        ("rpc_timeout_ms", ctypes.c_int64),
        ("wait_timeout_ms", ctypes.c_int64),
        ("reconnect_timeout_ms", ctypes.c_int64),
        ("heartbeat_interval_ms", ctypes.c_int64),
        ("tls_ca_file", ctypes.c_char_p),
        ("tls_cert_file", ctypes.c_char_p),
        ("tls_key_file", ctypes.c_char_p),
        ("tls_server_name", ctypes.c_char_p),
        ("job_token", ctypes.c_char_p),
        ("job_token_file", ctypes.c_char_p),
        ("log", _LogFunction),
        ("log_context", ctypes.c_void_p),
        ("identity_file", ctypes.c_char_p),
    ]


class _TensorSpec(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
    ]


class _Registration(ctypes.Structure):
    _fields_ = [
        ("rank", ctypes.c_int32),
        ("num_workers", ctypes.c_int32),
        ("version", ctypes.c_int64),
        ("consistency", ctypes.c_char * _CONSISTENCY_SIZE),
        ("staleness_bound", ctypes.c_int64),
        ("independent_steps", ctypes.c_int32),
        ("exact_pulls", ctypes.c_int32),
        ("dynamic_members", ctypes.c_int32),
        ("loss_scale", ctypes.c_float),
        ("num_segments", ctypes.c_int64),
        ("num_elements", ctypes.c_int64),
        ("optimizer", ctypes.c_char * _OPTIMIZER_SIZE),
    ]


@dataclasses.dataclass(frozen=True)
class Registration:
    """The job's settings, as ps_registration has them (ps_client.h)."""
    rank: int
    num_workers: int
    version: int              # the version to pull first
    consistency: str          # "sync", "async" or "ssp:S"
    staleness_bound: int      # ssp:S's S
    independent_steps: bool   # async: this worker counts its iterations from 0
    exact_pulls: bool         # a pull of version v brings exactly v
    dynamic_members: bool     # read the members of each iteration (Client.members)
    loss_scale: float         # dynamic loss scaling's scale; 0: none
    num_segments: int
    num_elements: int
    optimizer: str            # "sgd": versions are parameters; "none": mean gradients

    @staticmethod
    def _from(r: _Registration) -> "Registration":
        return Registration(
            rank=r.rank, num_workers=r.num_workers, version=r.version,
            consistency=r.consistency.decode(), staleness_bound=r.staleness_bound,
            independent_steps=bool(r.independent_steps), exact_pulls=bool(r.exact_pulls),
            dynamic_members=bool(r.dynamic_members), loss_scale=r.loss_scale,
            num_segments=r.num_segments, num_elements=r.num_elements,
            optimizer=r.optimizer.decode())


def library_path() -> str:
    """Where the library is looked for: $PS_CLIENT_LIBRARY, else next to this file."""
    return os.environ.get("PS_CLIENT_LIBRARY") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "libps_client.so")


_lib = None
_lib_lock = threading.Lock()


def _declare(lib: ctypes.CDLL) -> None:
    c = ctypes
    P = c.POINTER
    status = c.c_int32
    err = P(_Error)
    signatures = {
        "ps_client_abi_version": (c.c_int32, []),
        "ps_status_name": (c.c_char_p, [c.c_int32]),
        "ps_options_init": (status, [P(_Options), c.c_int32, err]),
        "ps_client_connect": (status, [P(_Options), P(c.c_void_p), err]),
        "ps_client_close": (None, [c.c_void_p]),
        "ps_client_register": (status, [c.c_void_p, P(_TensorSpec), c.c_int64, c.c_void_p,
                                        c.c_int64, c.c_int64, P(_Registration), err]),
        "ps_client_registration": (status, [c.c_void_p, P(_Registration), err]),
        "ps_client_segment_ends": (status, [c.c_void_p, P(c.c_int64), c.c_int64,
                                            P(c.c_int64), err]),
        "ps_client_push": (status, [c.c_void_p, c.c_int64, c.c_int64, c.c_int32, c.c_int32,
                                    c.c_void_p, c.c_int64, P(c.c_void_p), err]),
        "ps_client_pull": (status, [c.c_void_p, c.c_int64, c.c_int32, c.c_int32, c.c_void_p,
                                    c.c_int64, P(c.c_void_p), err]),
        "ps_handle_wait": (status, [c.c_void_p, c.c_int64, P(c.c_int32), err]),
        "ps_handle_poll": (status, [c.c_void_p, P(c.c_int32), err]),
        "ps_handle_free": (None, [c.c_void_p]),
        "ps_client_wait_for_version": (status, [c.c_void_p, c.c_int64, err]),
        "ps_client_pull_all": (status, [c.c_void_p, c.c_int64, c.c_void_p, c.c_int64,
                                        P(c.c_int64), err]),
        "ps_client_members": (status, [c.c_void_p, c.c_int64, P(c.c_int32), c.c_int32,
                                       P(c.c_int32), err]),
        "ps_client_loss_scale": (status, [c.c_void_p, P(c.c_float), err]),
        "ps_client_reconnect": (status, [c.c_void_p, c.c_void_p, c.c_int64,
                                         P(_Registration), err]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


def load(path: Optional[str] = None) -> ctypes.CDLL:
    """The library (loaded once per process), its ABI checked.

    Raises OSError naming the path when it cannot be loaded, and ps.Error
    (FAILED_PRECONDITION) when it speaks another ABI than this binding.
    """
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = path or library_path()
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise OSError(
                f"cannot load the ps client library {path}: {e} (build it with "
                "`bazel build //worker/python:ps`, or set PS_CLIENT_LIBRARY to "
                "libps_client.so)") from e
        _declare(lib)
        abi = lib.ps_client_abi_version()
        if abi != ABI_VERSION:
            raise Error(FAILED_PRECONDITION,
                        f"{path} speaks ps_client ABI {abi}; this binding is written for "
                        f"ABI {ABI_VERSION}: use the library built with it")
        _lib = lib
        return lib


def _check(status: int, error: _Error) -> None:
    if status != OK:
        raise Error(status, error.message.decode("utf-8", "replace"))


def _text(value: Optional[str]) -> Optional[bytes]:
    return None if value is None else str(value).encode()


def _float_buffer(buffer, writable: bool, what: str) -> Tuple[int, int, object]:
    """The address and element count of a C-contiguous float32 buffer, and
    what to keep alive while the library uses it (it also holds the buffer's
    export, so an array.array cannot be resized under the library)."""
    interface = getattr(buffer, "__array_interface__", None)
    if interface is not None:  # numpy, without importing it
        if interface.get("typestr") not in ("<f4", "=f4", "|f4"):
            raise TypeError(f"{what} must hold float32, not {interface.get('typestr')}")
        if interface.get("strides") is not None:
            # C-contiguous arrays may still report strides; check they are.
            shape = interface["shape"]
            expected, stride = [], 4
            for dim in reversed(shape):
                expected.insert(0, stride)
                stride *= dim
            if tuple(interface["strides"]) != tuple(expected):
                raise TypeError(f"{what} must be C-contiguous")
        address, readonly = interface["data"]
        if writable and readonly:
            raise TypeError(f"{what} is read-only; the pull writes into it")
        count = 1
        for dim in interface["shape"]:
            count *= dim
        return address, count, buffer
    view = memoryview(buffer)
    if view.format not in ("f", "<f", "=f") or view.itemsize != 4:
        raise TypeError(f"{what} must hold float32 (format 'f'), not format '{view.format}'")
    if not view.c_contiguous:
        raise TypeError(f"{what} must be C-contiguous")
    if view.readonly:
        raise TypeError(f"{what} is read-only: pass a writable buffer or a numpy array")
    if view.nbytes == 0:
        return 0, 0, view
    exported = ctypes.c_char.from_buffer(view)
    return ctypes.addressof(exported), view.nbytes // 4, exported


class Handle:
    """One push or pull (ps_handle): wait on it or poll it.

    Keeps the buffer alive until the operation is done. Freed by close() or
    when garbage-collected; freeing waits for an operation still in flight
    (it cannot be called back: the buffer is the network's until it ends).
    """

    _WAIT_SLICE_MS = 100  # a wait returns to Python this often: Ctrl-C works

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p, buffer, what: str):
        self._lib = lib
        self._handle = handle
        self._buffer = buffer
        self.what = what

    def _wait(self, timeout_ms: int) -> bool:
        if self._handle is None:
            raise Error(FAILED_PRECONDITION, f"{self.what}: the handle is closed")
        done = ctypes.c_int32(0)
        error = _Error()
        status = self._lib.ps_handle_wait(self._handle, timeout_ms, ctypes.byref(done),
                                          ctypes.byref(error))
        if done.value:
            self._buffer = None  # the library is done with it
        _check(status, error)
        return bool(done.value)

    def done(self) -> bool:
        """Whether the operation has finished; raises its Error if it failed."""
        return self._wait(0)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits up to `timeout` seconds (None: until done); whether it is done.

        Raises the operation's Error if it failed, every time it is asked.
        """
        if timeout is not None and timeout <= 0:
            return self._wait(0)
        left_ms = None if timeout is None else int(timeout * 1000)
        while True:
            slice_ms = self._WAIT_SLICE_MS if left_ms is None else min(self._WAIT_SLICE_MS,
                                                                       left_ms)
            if self._wait(slice_ms):
                return True
            if left_ms is not None:
                left_ms -= slice_ms
                if left_ms <= 0:
                    return False

    def close(self) -> None:
        """Frees the handle, first waiting for the operation if still in flight."""
        if self._handle is not None:
            self._lib.ps_handle_free(self._handle)
            self._handle = None
            self._buffer = None

    def __del__(self):
        self.close()

    def __repr__(self) -> str:
        return f"<ps Handle {self.what}>"


class Client:
    """One worker's connection to a parameter-server job (ps_client).

    The keyword arguments are ps_options's (ps_client.h), durations in
    seconds. The job token is read from `job_token_file` when given, else
    taken from `job_token`, else from $PS_JOB_TOKEN, as the worker daemon
    reads it. `log` receives the library's log lines (register's retries,
    stall reports), from its threads; None: they go to stderr. Thread-safe
    as ps_client.h says.
    """

    def __init__(self, servers: str, *, worker_id: str = "", rank: int = -1,
                 connections: int = 1, compression: str = "none",
                 shared_memory: bool = False, connect_timeout: float = 60.0,
                 rpc_timeout: float = 60.0, wait_timeout: float = 600.0,
                 reconnect_timeout: float = 300.0, heartbeat_interval: float = 2.0,
                 tls_ca: str = "", tls_cert: str = "", tls_key: str = "",
                 tls_server_name: str = "", job_token: Optional[str] = None,
                 job_token_file: str = "", log: Optional[Callable[[str], None]] = None,
                 library: Optional[str] = None, identity_file: str = ""):
        self._client = None  # first: __del__ runs after a failed __init__ too
        self._log = None
        self._lib = load(library)
        error = _Error()
        options = _Options()
        _check(self._lib.ps_options_init(ctypes.byref(options), ABI_VERSION,
                                         ctypes.byref(error)), error)
        if job_token is None and not job_token_file:
            job_token = os.environ.get("PS_JOB_TOKEN")
        # Kept until connect has copied them.
        strings = {
            "servers": servers, "worker_id": worker_id, "compression": compression,
            "tls_ca_file": tls_ca, "tls_cert_file": tls_cert, "tls_key_file": tls_key,
            "tls_server_name": tls_server_name, "job_token": job_token or "",
            "job_token_file": job_token_file, "identity_file": identity_file,
        }
        encoded = {name: _text(value) for name, value in strings.items()}
        for name, value in encoded.items():
            setattr(options, name, value)
        if log is not None:
            # Called from the library's threads (ctypes takes the GIL); kept
            # alive as long as the client.
            self._log = _LogFunction(lambda _context, line: log(line.decode("utf-8", "replace")))
            options.log = self._log
        options.rank = rank
        options.connections = connections
        options.shared_memory = 1 if shared_memory else 0
        for name, seconds in (("connect_timeout_ms", connect_timeout),
                              ("rpc_timeout_ms", rpc_timeout),
                              ("wait_timeout_ms", wait_timeout),
                              ("reconnect_timeout_ms", reconnect_timeout),
                              ("heartbeat_interval_ms", heartbeat_interval)):
            setattr(options, name, int(round(seconds * 1000)))
        client = ctypes.c_void_p()
        _check(self._lib.ps_client_connect(ctypes.byref(options), ctypes.byref(client),
                                           ctypes.byref(error)), error)
        self._client = client
        self._registration: Optional[Registration] = None

    def _call(self, name: str, *args) -> None:
        if self._client is None:
            raise Error(FAILED_PRECONDITION, f"{name}: the client is closed")
        error = _Error()
        _check(getattr(self._lib, name)(self._client, *args, ctypes.byref(error)), error)

    def register(self, tensors: Sequence[Tuple], initial=None,
                 steps_per_epoch: int = 0) -> Registration:
        """Registers the model: `tensors` as (name, shape) or (name, shape, dtype).

        dtype is a name ("float32", "F32", ...) or a DTYPE_* value; only
        float32 is taken. `initial`: a float32 buffer of the model's values
        (or None). Returns the job's settings; pull registration.version
        first.
        """
        specs = (_TensorSpec * len(tensors))()
        keep_specs = []
        for i, tensor in enumerate(tensors):
            name, shape = tensor[0], [int(d) for d in tensor[1]]
            dtype = tensor[2] if len(tensor) > 2 else DTYPE_F32
            if isinstance(dtype, str):
                if dtype not in _DTYPES:
                    raise Error(INVALID_ARGUMENT,
                                f"tensor {i} ('{name}') has dtype '{dtype}', which is none of "
                                f"{sorted(set(_DTYPES))}")
                dtype = _DTYPES[dtype]
            dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
            encoded_name = str(name).encode()
            keep_specs.append((dims, encoded_name))
            specs[i].name = encoded_name
            specs[i].shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
            specs[i].ndim = len(shape)
            specs[i].dtype = int(dtype)
        address, count, keep = (0, 0, None) if initial is None else _float_buffer(
            initial, writable=False, what="the initial values")
        out = _Registration()
        self._call("ps_client_register", specs, len(tensors), address or None, count,
                   steps_per_epoch, ctypes.byref(out))
        del keep, keep_specs  # the call has read them
        self._registration = Registration._from(out)
        return self._registration

    @property
    def registration(self) -> Registration:
        """The last registration's settings (register's or reconnect's)."""
        out = _Registration()
        self._call("ps_client_registration", ctypes.byref(out))
        return Registration._from(out)

    def segment_ends(self) -> List[int]:
        """The segments' end offsets into the flat buffer, in elements."""
        count = ctypes.c_int64(0)
        self._call("ps_client_segment_ends", None, 0, ctypes.byref(count))
        ends = (ctypes.c_int64 * max(1, count.value))()
        self._call("ps_client_segment_ends", ends, count.value, ctypes.byref(count))
        return list(ends[:count.value])

    def push(self, iteration: int, num_samples: int, first: int, last: int,
             gradient) -> Handle:
        """Starts pushing segments [first, last) of `gradient` (the whole flat buffer)."""
        address, count, keep = _float_buffer(gradient, writable=False, what="the gradient")
        handle = ctypes.c_void_p()
        self._call("ps_client_push", iteration, num_samples, first, last, address or None,
                   count, ctypes.byref(handle))
        return Handle(self._lib, handle, keep,
                      f"push of segments [{first}, {last}) of iteration {iteration}")

    def pull(self, version: int, first: int, last: int, params) -> Handle:
        """Starts pulling segments [first, last) of `version` into `params` (the whole buffer)."""
        address, count, keep = _float_buffer(params, writable=True, what="the parameters")
        handle = ctypes.c_void_p()
        self._call("ps_client_pull", version, first, last, address or None, count,
                   ctypes.byref(handle))
        return Handle(self._lib, handle, keep,
                      f"pull of segments [{first}, {last}) of version {version}")

    def wait_for_version(self, version: int) -> None:
        """Blocks until `version` is published."""
        self._call("ps_client_wait_for_version", version)

    def pull_all(self, version: int, params) -> int:
        """Blocks while pulling the whole model of `version`; the version pulled."""
        address, count, keep = _float_buffer(params, writable=True, what="the parameters")
        pulled = ctypes.c_int64(-1)
        self._call("ps_client_pull_all", version, address or None, count, ctypes.byref(pulled))
        del keep  # written by now
        return pulled.value

    def members(self, iteration: int) -> List[int]:
        """The ranks taking part in `iteration`, ascending."""
        count = ctypes.c_int32(0)
        self._call("ps_client_members", iteration, None, 0, ctypes.byref(count))
        ranks = (ctypes.c_int32 * max(1, count.value))()
        self._call("ps_client_members", iteration, ranks, count.value, ctypes.byref(count))
        return list(ranks[:count.value])

    def loss_scale(self) -> float:
        """The loss scale of the next step (0: the server does not scale)."""
        scale = ctypes.c_float(0)
        self._call("ps_client_loss_scale", ctypes.byref(scale))
        return scale.value

    def reconnect(self, initial=None) -> Registration:
        """Registers again after an Error with server_lost; pull its version next."""
        address, count, keep = (0, 0, None) if initial is None else _float_buffer(
            initial, writable=False, what="the initial values")
        out = _Registration()
        self._call("ps_client_reconnect", address or None, count, ctypes.byref(out))
        del keep  # read by now
        self._registration = Registration._from(out)
        return self._registration

    def close(self) -> None:
        """Waits for pushes and pulls in flight, then closes the connections."""
        if self._client is not None:
            self._lib.ps_client_close(self._client)
            self._client = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()
