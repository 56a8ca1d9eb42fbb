"""ps: the parameter server from Python.

`ps._native` is the thin ctypes binding of the C-ABI client library
(libps_client.so, worker/client/ps_client.h); ps.torch (DistributedOptimizer
and friends, docs/pytorch.md) is built on it and imported on its own, so
`import ps` needs no torch. docs/client.md tells how to build and import it.
"""

from ps._native import Client, Error, Handle, Registration

__all__ = ["Client", "Error", "Handle", "Registration"]
