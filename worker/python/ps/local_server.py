"""Starting a server daemon on this machine, on a port it picks.

For launchers and tests: `start(binary, flags)` runs the server with
--port=0 and --port_file, waits until it serves and returns the process and
the address workers connect to. Needs nothing but the standard library.
"""

import os
import subprocess
import tempfile
import time
from typing import IO, List, Optional, Tuple

_POLL_S = 0.05  # how often the port file is looked for while the server starts


def start(binary: str, flags: List[str], log: Optional[IO] = None, timeout_s: float = 60,
          tmp: Optional[str] = None) -> Tuple[subprocess.Popen, str]:
    """Starts `binary` with `flags` and waits until it has written its port.

    Returns (process, "127.0.0.1:PORT"). The server's output goes to `log`
    (inherited when None). Raises RuntimeError, naming the binary, when the
    server exits before serving or writes no port within `timeout_s` (then
    it is terminated). `tmp`: where the port file goes (a new temporary
    directory when None).
    """
    port_file = os.path.join(tmp or tempfile.mkdtemp(), "port")
    server = subprocess.Popen([binary, "--port=0", f"--port_file={port_file}"] + list(flags),
                              stdout=log, stderr=subprocess.STDOUT if log else None)
    deadline = time.monotonic() + timeout_s
    while not (os.path.exists(port_file) and os.path.getsize(port_file) > 0):
        if server.poll() is not None:
            raise RuntimeError(f"the server {binary} exited with status {server.returncode} "
                               "before serving")
        if time.monotonic() > deadline:
            server.terminate()
            server.wait()
            raise RuntimeError(f"the server {binary} wrote no port within {timeout_s} s")
        time.sleep(_POLL_S)
    with open(port_file) as f:
        return server, f"127.0.0.1:{int(f.read().strip())}"
