"""Starts W worker processes of a training script (and a server when none is given).

    python3 -m ps.torch.run --workers=W [--servers=S] [--server=PATH
        [--server_arg=FLAG ...]] -- SCRIPT [ARGS...]

Each worker runs `python3 SCRIPT ARGS` (this interpreter) with PS_SERVERS,
RANK, LOCAL_RANK and WORLD_SIZE set, as torchrun sets them, so the script's
ps.torch.init() needs no arguments, and with PYTHONPATH leading to this ps
package. Without --servers, the server binary (--server, else
$PS_SERVER_BINARY) is started on a free local port with --num_workers=W
and each --server_arg, and stopped when the workers are done.

Exit status: 0 when every worker exited 0; else the first failing worker's
status (the others are terminated then), 1 when the server started here
exits while workers run (they are terminated then), or 2 for bad
arguments, naming the problem. The workers' output goes to this process's stdout and stderr.
"""

import argparse
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from typing import List, Optional

from ps import local_server

_SERVER_START_TIMEOUT_S = 60


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m ps.torch.run",
        description="Runs W ps.torch workers of SCRIPT (and a server unless --servers).")
    parser.add_argument("--workers", type=int, required=True, help="worker processes (>= 1)")
    parser.add_argument("--servers", default="",
                        help="host:port[,host:port...] of running servers; empty: start one")
    parser.add_argument("--server", default=os.environ.get("PS_SERVER_BINARY", ""),
                        help="the server binary to start without --servers "
                             "(default $PS_SERVER_BINARY)")
    parser.add_argument("--server_arg", action="append", default=[],
                        help="a flag for the started server, e.g. --server_arg=--lr=0.1")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return parser


def _start_server(binary: str, workers: int, flags: List[str], tmp: str) -> (subprocess.Popen,
                                                                              str):
    return local_server.start(binary, [f"--num_workers={workers}"] + flags,
                              timeout_s=_SERVER_START_TIMEOUT_S, tmp=tmp)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    options = parser.parse_args(argv)
    if options.workers < 1:
        parser.error(f"--workers must be at least 1, got {options.workers}")
    if not os.path.isfile(options.script):
        parser.error(f"the script {options.script} does not exist")
    if not options.servers and not options.server:
        parser.error("no --servers to join and no --server binary (or $PS_SERVER_BINARY) "
                     "to start")
    if options.servers and options.server_arg:
        parser.error("--server_arg is for a server this launcher starts, not with --servers")
    args = options.args[1:] if options.args[:1] == ["--"] else options.args

    server = None
    servers = options.servers
    tmp = tempfile.mkdtemp(prefix="ps_torch_run_")
    if not servers:
        try:
            server, servers = _start_server(options.server, options.workers,
                                            options.server_arg, tmp)
        except (OSError, RuntimeError) as e:
            print(f"ps.torch.run: {e}", file=sys.stderr)
            return 2
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))))
    workers = []
    status = 0
    try:
        for rank in range(options.workers):
            env = dict(os.environ)
            env.update(PS_SERVERS=servers, RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(options.workers))
            env["PYTHONPATH"] = os.pathsep.join(
                [package_parent] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
            workers.append(subprocess.Popen([sys.executable, options.script] + args, env=env))
        # One thread per worker waits for it, and one for the server started
        # here; the first failure stops the rest. A server that exits under
        # running workers stops them too: they would otherwise wait up to
        # their reconnect_timeout for a server nobody restarts.
        exits: "queue.Queue[tuple]" = queue.Queue()
        for rank, worker in enumerate(workers):
            threading.Thread(target=lambda r=rank, w=worker: exits.put((r, w.wait())),
                             daemon=True).start()
        if server is not None:
            threading.Thread(target=lambda: exits.put(("server", server.wait())),
                             daemon=True).start()
        running = len(workers)
        while running:
            rank, code = exits.get()
            if rank == "server":
                if status == 0:
                    print(f"ps.torch.run: the server exited with status {code} while the "
                          "workers ran; stopping them", file=sys.stderr)
                    status = 1
                    for other in workers:
                        _stop(other)
                continue
            running -= 1
            if code != 0 and status == 0:
                print(f"ps.torch.run: worker {rank} exited with status {code}; stopping "
                      "the others", file=sys.stderr)
                status = code if code > 0 else 1
                for other in workers:
                    _stop(other)
    finally:
        for worker in workers:
            _stop(worker)
        if server is not None:
            _stop(server)
    return status


if __name__ == "__main__":
    sys.exit(main())
