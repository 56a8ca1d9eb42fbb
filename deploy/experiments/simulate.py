#!/usr/bin/env python3
"""A flow-level simulator of the experiments' data-parallel step on SimGrid
3.32 (Debian's python3-simgrid), for the 64-2,048 workers two cores cannot
emulate: the synchronous parameter server (S shards, dedicated server hosts
or one on each of the first S worker hosts, chunked pushes and pulls in
priority order) and ring all-reduce (DDP's buckets, overlapped with
backward), driven by a model profile (model_profile.py) and the emulator's
link settings (run.sh: each host one full-duplex link of --rate to one
switch, --delay ms one way between two hosts).

    /usr/bin/python3 deploy/experiments/simulate.py --protocol=ps --workers=16 --servers=2 \\
        --rate=1gbit --delay=0 --profile=deploy/experiments/profiles/vgg16.json
    /usr/bin/python3 deploy/experiments/simulate.py --protocol=ring --workers=64 --rate=10gbit ...
    /usr/bin/python3 deploy/experiments/simulate.py --sweep --out=/tmp/sim   # the default sweep, W = 2 ... 512
    /usr/bin/python3 deploy/experiments/simulate.py --sweep --protocol=ps,ring --workers=2,4,8 \\
        --servers=1,W --placement=dedicated --rate=100mbit,1gbit --profile=A.json,B.json --csv=OUT.csv

One configuration prints a summary and, with --csv, appends a row (the
emulator's results.csv fields where they apply, then the simulator's own);
--json writes the row with each host's bytes. --sweep runs every
combination of the comma-separated values (--servers=W: as many shards as
workers) in a fresh process each (SimGrid runs one simulation per
process) and appends each row to --csv (default OUT/sim.csv).

The platform: one SimGrid star zone, each host joined to the centre by a
split-duplex link of --rate (its up and down directions carry R each) and
--delay/2 latency (host to host: --delay); a host's own loopback is
unshaped (model.py's UNSHAPED_BPS) with no latency. The network model is
CM02 with the bandwidth factor --wire (1448 / 1514: tbf counts the
frames' headers, the tensors get the rest), latency factor 1, no cross
traffic and TCP windows of --tcp_window bytes (Linux's tcp_rmem maximum:
a flow gets at most window / RTT). Flows share links max-min fairly.

Protocols (every worker runs one actor, an event loop over its compute,
its transfers and timers; each PS shard one actor):
  ps    The flat parameter buffer (the profile's tensor order) is cut into
        S contiguous, equal ranges (shard_plan.h, without its slack), each
        cut into messages of at most --chunk_bytes less the envelope,
        small tensors packed together, a tensor larger than a message cut
        into whole messages from its start. A step: forward layer by layer,
        each layer waiting for every message that holds its tensors
        (version k for step k); backward layer by layer in reverse, each
        message pushable once all of its tensors' gradients exist. Pushes
        go out front layers first (within a layer from its last message)
        within --max_bytes_in_flight; a push is acknowledged one delay after
        it arrives, and then its pull is requested (a small message, in the
        same priority order and window); a shard answers a pull once all W
        workers' pushes of that message have arrived (summing takes no
        time). The step ends when backward ends; the next forward waits.
  ring  DDP: tensors in reverse order into buckets of --bucket_mb (the
        first --first_bucket_mb), a tensor never split, a bucket closed
        once it reaches its cap; a bucket is all-reduced once backward has
        made all of its gradients, one bucket at a time in bucket order, by
        reduce-scatter and all-gather: 2(W - 1) steps, each host sending
        bucket / W bytes to the next and receiving from the one before.
        The step waits for every bucket before the next forward.
        --ring_hosts=pair (the default above 64 workers, --ring_hosts=auto)
        simulates two hosts exchanging those same 2(W - 1) messages: on
        identical links to one switch, with identical compute, every
        ring step's W flows are alike and share no link, so each host sees
        exactly what the pair sees (tests check the two agree), at 2 / W
        of the cost.

Measured as results.py does: worker 0's step time from the start of step
--warmup_steps to the start of the last step (a step starts when the
previous backward ends). bound_s: max(compute, link_bound_s), the least a
step can take: compute (the profile's forward + backward) and, on the
busiest host link direction, the bytes a step must move (ps dedicated:
max(M, W M / S); ps colocated: a shard host's M (S - 1) / S + (W - 1) M / S;
ring: 2 (W - 1) / W M) over R times --wire. No compute on the servers, no
optimizer, no stragglers, no loss: a simulated step is what the links and
the schedule allow.
"""

import argparse
import collections
import csv
import heapq
import itertools
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import model_profile  # noqa: E402
from model import UNSHAPED_BPS, WIRE, rate_bps  # noqa: E402

CHUNK_BYTES = 4 << 20          # the server's default --chunk_bytes
ENVELOPE_BYTES = 4096          # what a message keeps for its envelope (model.py's MESSAGE_BYTES)
REQUEST_BYTES = 64             # a pull request (and any message without tensor bytes)
TCP_WINDOW = 6291456           # Debian 12's net.ipv4.tcp_rmem maximum
RING_FULL_MAX = 64             # --ring_hosts=auto: the whole ring up to this many workers
SWEEP_WORKERS = "2,4,8,16,32,64,128,256,512"

# The emulator's results.csv fields this simulator fills, in results.py's
# order (the others, e.g. per-host columns and the CPU's, do not apply; the
# per-host bytes are in --json).
RESULT_FIELDS = [
    "run", "workers", "servers", "rate", "rate_bits_per_second", "delay_ms", "delay_method",
    "congestion", "model", "compute", "replay_step_s", "global_batch_size", "steps",
    "model_parameters", "samples_per_second", "warmup_steps", "window_steps", "step_time_s",
    "model_bytes", "window_s", "max_link_utilisation", "busiest_link", "link_bound_s",
    "step_over_link_bound", "payload_bound_s", "step_over_payload_bound", "split_compute",
    "split_wait",
]
SIM_FIELDS = ["protocol", "placement", "shard_plan", "compute_s", "bound_s", "step_over_bound", "messages",
              "ring_hosts", "profile", "sim_time_s", "sim_wall_s"]


# --- What moves: messages (ps) and buckets (ring), from the profile ---

class Layout:
    """The profile scaled: per-layer seconds, each tensor's bytes and layer."""

    def __init__(self, profile, compute_scale):
        self.profile = profile
        self.forward_s = [l["forward_ms"] * compute_scale / 1000 for l in profile["layers"]]
        self.backward_s = [l["backward_ms"] * compute_scale / 1000 for l in profile["layers"]]
        layer_of = {name: i for i, l in enumerate(profile["layers"]) for name in l["tensors"]}
        self.tensor_bytes = [model_profile.tensor_bytes(t) for t in profile["tensors"]]
        self.tensor_layer = [layer_of[t["name"]] for t in profile["tensors"]]
        self.model_bytes = sum(self.tensor_bytes)
        self.parameters = sum(math.prod(t["shape"]) for t in profile["tensors"])
        self.compute_s = sum(self.forward_s) + sum(self.backward_s)


class Message:
    __slots__ = ("index", "shard", "bytes", "layers", "first_layer")

    def __init__(self, index, shard, size, layers):
        self.index, self.shard, self.bytes, self.layers = index, shard, size, sorted(layers)
        self.first_layer = self.layers[0]


def ps_messages(layout, servers, chunk_bytes, plan="range"):
    """The messages of a push (and of a pull), in buffer order. plan
    "range": S contiguous ranges (shard_plan.h); "round_robin": the whole
    buffer cut into messages dealt to the shards in turn (BytePS's
    partitions), so consecutive messages of a large tensor go to
    different shards."""
    payload = max(1, chunk_bytes - ENVELOPE_BYTES)
    total = layout.model_bytes
    if plan == "round_robin":
        messages = ps_messages(layout, 1, chunk_bytes)
        for m in messages:
            m.shard = m.index % servers
        return messages
    cuts = [total * s // servers for s in range(servers + 1)]
    # Pieces (shard, layer, bytes): tensors cut at the shards' boundaries.
    pieces, offset, shard = [], 0, 0
    for size, layer in zip(layout.tensor_bytes, layout.tensor_layer):
        end = offset + size
        while offset < end:
            while shard < servers - 1 and offset >= cuts[shard + 1]:
                shard += 1
            piece_end = min(end, cuts[shard + 1]) if shard < servers - 1 else end
            pieces.append((shard, layer, piece_end - offset))
            offset = piece_end
    messages, current, current_bytes, current_shard = [], set(), 0, None

    def flush():
        nonlocal current, current_bytes
        if current_bytes:
            messages.append(Message(len(messages), current_shard, current_bytes, current))
        current, current_bytes = set(), 0

    for shard, layer, size in pieces:
        if shard != current_shard:
            flush()
            current_shard = shard
        if size > payload:
            flush()
            while size > payload:
                messages.append(Message(len(messages), shard, payload, {layer}))
                size -= payload
            current, current_bytes = {layer}, size
        elif current_bytes + size > payload:
            flush()
            current, current_bytes = {layer}, size
        else:
            current.add(layer)
            current_bytes += size
    flush()
    return messages


def ddp_buckets(layout, bucket_bytes, first_bucket_bytes):
    """[(bytes, last layer whose backward completes it)] in DDP's order."""
    buckets, size, layers, cap = [], 0, set(), first_bucket_bytes
    for t in reversed(range(len(layout.tensor_bytes))):
        size += layout.tensor_bytes[t]
        layers.add(layout.tensor_layer[t])
        if size >= cap:
            buckets.append((size, min(layers)))
            size, layers, cap = 0, set(), bucket_bytes
    if size:
        buckets.append((size, min(layers)))
    return buckets


# --- The simulation ---

class Loop:
    """An actor's event loop: timers and the communications it waits on.
    Handlers run in the actor; `after` runs after every event."""

    def __init__(self, simgrid, after):
        self.sg, self.after = simgrid, after
        self.timers, self.seq = [], itertools.count()
        self.comms, self.handlers = [], []

    def at(self, t, handler):
        heapq.heappush(self.timers, (t, next(self.seq), handler))

    def watch(self, comm, handler):
        self.comms.append(comm)
        self.handlers.append(handler)

    def run(self, done):
        sg = self.sg
        while not done():
            now = sg.Engine.clock
            if self.timers and self.timers[0][0] <= now + 1e-12:
                heapq.heappop(self.timers)[2]()
            elif self.comms:
                if self.timers:
                    i = sg.Comm.wait_any_for(self.comms, max(0.0, self.timers[0][0] - now))
                else:
                    i = sg.Comm.wait_any(self.comms)
                if i < 0:
                    continue
                self.comms.pop(i)
                self.handlers.pop(i)()
            elif self.timers:
                sg.this_actor.sleep_until(self.timers[0][0])
                continue
            else:
                raise RuntimeError("deadlock: nothing to wait for")
            self.after()


class Worker:
    """One worker's compute as a generator of ('sleep', s) and ('wait',
    predicate), driven by its Loop; the protocols add their transfers."""

    def __init__(self, sim, rank):
        self.sim, self.rank = sim, rank
        self.step_starts, self.compute_time = [], 0.0
        self.blocked, self.finished = None, False

    def start(self, sg):
        self.loop = Loop(sg, self.wake)
        self.gen = self.steps()
        self.advance()
        self.loop.run(lambda: self.finished)

    def wake(self):
        if self.blocked is not None and self.blocked():
            self.blocked = None
            self.advance()

    def advance(self):
        while True:
            try:
                kind, arg = next(self.gen)
            except StopIteration:
                self.finished = True
                return
            if kind == "sleep":
                if arg > 0:
                    self.compute_time += arg
                    self.loop.at(self.sim.sg.Engine.clock + arg, self.advance)
                    return
            elif not arg():
                self.blocked = arg
                return


class PsWorker(Worker):
    def __init__(self, sim, rank):
        super().__init__(sim, rank)
        self.version = [0] * len(sim.messages)  # the step whose parameters it holds
        self.push_queue, self.pull_queue = [], []
        self.push_bytes = self.pull_bytes = 0
        # One TCP connection per shard for pushes: its messages go in turn.
        self.connection = [collections.deque() for _ in range(sim.servers)]
        self.busy = [False] * sim.servers

    def steps(self):
        sim = self.sim
        fwd, bwd = sim.layout.forward_s, sim.layout.backward_s
        for step in range(sim.steps):
            self.step_starts.append(sim.sg.Engine.clock)
            ahead = 0.0  # compute whose parameters are here already, not yet slept
            for layer in range(len(fwd)):
                if not self.have(layer, step):
                    if ahead:
                        yield ("sleep", ahead)
                        ahead = 0.0
                    yield ("wait", lambda layer=layer, step=step: self.have(layer, step))
                ahead += fwd[layer]
            for layer in reversed(range(len(bwd))):
                ahead += bwd[layer]
                if sim.ready_after[layer]:
                    yield ("sleep", ahead)
                    ahead = 0.0
                    for m in sim.ready_after[layer]:
                        heapq.heappush(self.push_queue, (sim.priority[m], m, step))
                    self.send_pushes()
            yield ("sleep", ahead)
        yield ("wait", lambda: min(self.version) >= sim.steps)

    def have(self, layer, step):
        return all(self.version[m] >= step for m in self.sim.needed[layer])

    def send_pushes(self):
        """Issue pushes in priority order within the window; each shard's
        connection carries them one after another."""
        sim, window = self.sim, self.sim.window
        while self.push_queue:
            m = sim.messages[self.push_queue[0][1]]
            if self.push_bytes and self.push_bytes + m.bytes > window:
                return
            _, index, step = heapq.heappop(self.push_queue)
            self.push_bytes += m.bytes
            self.connection[m.shard].append((index, step))
            self.transmit(m.shard)

    def transmit(self, shard):
        if self.busy[shard] or not self.connection[shard]:
            return
        index, step = self.connection[shard].popleft()
        m = self.sim.messages[index]
        self.busy[shard] = True
        self.sim.count(self.rank, shard, m.bytes, step)
        comm = self.sim.push_box(self.rank, shard).put_async((self.rank, index, step), m.bytes)
        self.loop.watch(comm, lambda: self.pushed(index, step))

    def pushed(self, index, step):
        # The reply takes one delay back (none from a shard on this host).
        m = self.sim.messages[index]
        self.busy[m.shard] = False
        self.transmit(m.shard)
        self.loop.at(self.sim.sg.Engine.clock + self.sim.latency(self.rank, m.shard),
                     lambda: self.acknowledged(index, step))

    def acknowledged(self, index, step):
        self.push_bytes -= self.sim.messages[index].bytes
        heapq.heappush(self.pull_queue, (self.sim.priority[index], index, step))
        self.send_pushes()
        self.send_pulls()

    def send_pulls(self):
        sim, window = self.sim, self.sim.window
        while self.pull_queue:
            m = sim.messages[self.pull_queue[0][1]]
            if self.pull_bytes and self.pull_bytes + m.bytes > window:
                return
            _, index, step = heapq.heappop(self.pull_queue)
            self.pull_bytes += m.bytes
            sim.request_box[m.shard].put_init((self.rank, index, step), REQUEST_BYTES).detach()

    def pulled(self, shard, data):
        index, step = data.get()
        self.version[index] = step + 1
        self.pull_bytes -= self.sim.messages[index].bytes
        self.receive(shard)
        self.send_pulls()

    def receive(self, shard):
        comm, data = self.sim.pull_box(shard, self.rank).get_async()
        self.loop.watch(comm, lambda: self.pulled(shard, data))

    def start(self, sg):
        self.loop = Loop(sg, self.wake)
        for shard in self.sim.shards_of_worker:
            self.receive(shard)
        self.gen = self.steps()
        self.advance()
        self.loop.run(lambda: self.finished)


class PsShard:
    """A shard: sums pushes (no time) and answers each pull once all W
    workers' pushes of its message have arrived; its answers to one worker
    share a connection, so they go one after another."""

    def __init__(self, sim, shard):
        self.sim, self.shard, self.host = sim, shard, sim.server_host_index(shard)
        self.count, self.complete, self.waiting = {}, {}, {}
        self.connection = [collections.deque() for _ in range(sim.workers)]
        self.busy = [False] * sim.workers

    def start(self, sg):
        sg.Actor.self().daemonize()
        self.loop = Loop(sg, lambda: None)
        for rank in range(self.sim.workers):
            self.receive(rank)
        self.receive(None)
        self.loop.run(lambda: False)

    def receive(self, rank):
        """The next push on rank's connection, or (rank None) the next pull
        request from any worker."""
        box = (self.sim.request_box[self.shard] if rank is None
               else self.sim.push_box(rank, self.shard))
        comm, data = box.get_async()
        self.loop.watch(comm, lambda: self.arrived(rank, data.get()))

    def arrived(self, connection, message):
        self.receive(connection)
        rank, index, step = message
        if connection is not None:
            n = self.count.get((index, step), 0) + 1
            if n < self.sim.workers:
                self.count[(index, step)] = n
                return
            self.count.pop((index, step), None)
            self.complete[index] = step
            for r in self.waiting.pop((index, step), ()):
                self.answer(r, index, step)
        elif self.complete.get(index, -1) >= step:
            self.answer(rank, index, step)
        else:
            self.waiting.setdefault((index, step), []).append(rank)

    def answer(self, rank, index, step):
        self.connection[rank].append((index, step))
        self.transmit(rank)

    def transmit(self, rank):
        if self.busy[rank] or not self.connection[rank]:
            return
        index, step = self.connection[rank].popleft()
        m = self.sim.messages[index]
        self.busy[rank] = True
        self.sim.count(self.host, rank, m.bytes, step, from_server=True)
        comm = self.sim.pull_box(self.shard, rank).put_async((index, step), m.bytes)
        self.loop.watch(comm, lambda: self.sent(rank))

    def sent(self, rank):
        self.busy[rank] = False
        self.transmit(rank)


class RingWorker(Worker):
    def __init__(self, sim, rank, peer_next, members):
        super().__init__(sim, rank)
        self.next, self.members = peer_next, members
        self.ready = []            # buckets whose gradients exist, this step
        self.reduced = 0           # buckets all-reduced, this step
        self.active = False

    def steps(self):
        sim = self.sim
        fwd, bwd = sim.layout.forward_s, sim.layout.backward_s
        for step in range(sim.steps):
            self.step_starts.append(sim.sg.Engine.clock)
            self.step, self.ready, self.reduced, self.next_bucket = step, [], 0, 0
            ahead = sum(fwd)
            for layer in reversed(range(len(bwd))):
                ahead += bwd[layer]
                if sim.ready_after[layer]:
                    yield ("sleep", ahead)
                    ahead = 0.0
                    self.ready += sim.ready_after[layer]
                    self.start_bucket()
            yield ("sleep", ahead)
            yield ("wait", lambda: self.reduced == len(sim.buckets))

    def start_bucket(self):
        if self.active or self.next_bucket >= len(self.sim.buckets):
            return
        if self.next_bucket not in self.ready:
            return
        self.active, self.bucket, self.ring_step = True, self.next_bucket, 0
        self.next_bucket += 1
        self.send_step()

    def send_step(self):
        sim = self.sim
        size = max(1, math.ceil(sim.buckets[self.bucket][0] / sim.workers))
        self.pending = 2
        sim.count(self.rank, self.next, size, self.step)
        send = sim.ring_box[self.next].put_async((self.bucket, self.ring_step), size)
        self.loop.watch(send, self.step_part_done)
        # Keep the receive's buffer alive until it completes (SimGrid
        # writes the payload into it).
        recv, data = sim.ring_box[self.rank].get_async()
        self.loop.watch(recv, lambda: self.step_part_done(data.get()))

    def step_part_done(self, _=None):
        self.pending -= 1
        if self.pending:
            return
        self.ring_step += 1
        if self.ring_step < 2 * (self.sim.workers - 1):
            self.send_step()
            return
        self.active = False
        self.reduced += 1
        self.start_bucket()


class Simulation:
    def __init__(self, a, profile):
        try:
            import simgrid as sg
        except ImportError as e:
            raise ValueError(f"no SimGrid for this Python ({e}): install python3-simgrid "
                             "(bash deploy/setup.sh experiments) and run /usr/bin/python3") from e
        self.sg, self.a = sg, a
        self.workers, self.steps = a.workers, a.steps
        self.bps = rate_bps(a.rate) if a.rate != "unshaped" else None
        if a.rate != "unshaped" and not self.bps:
            raise ValueError(f"--rate={a.rate}: not a rate (100mbit, 1gbit, ... or unshaped)")
        compute_scale = a.compute_scale * (a.batch_per_worker or profile["batch_size"]) \
            / profile["batch_size"]
        if a.compute_ms is not None:
            total = sum(l["forward_ms"] + l["backward_ms"] for l in profile["layers"])
            compute_scale = a.compute_ms / total if total else 0.0
        self.layout = Layout(profile, compute_scale)
        self.window = a.max_bytes_in_flight or float("inf")
        self.delay_s = a.delay / 1000
        self.messages, self.buckets = [], []
        n_layers = len(profile["layers"])
        self.ready_after = [[] for _ in range(n_layers)]
        if a.protocol == "ps":
            self.servers = a.servers
            self.colocated = a.placement == "colocated"
            if self.colocated and self.servers > self.workers:
                raise ValueError("--placement=colocated puts a shard on each of the first S "
                                 "worker hosts: --servers must be at most --workers")
            self.messages = ps_messages(self.layout, self.servers, a.chunk_bytes, a.shard_plan)
            self.needed = [[] for _ in range(n_layers)]
            for m in self.messages:
                for layer in m.layers:
                    self.needed[layer].append(m.index)
                self.ready_after[m.first_layer].append(m.index)
            # Front layers first; within a layer from its last message.
            self.priority = [(m.first_layer, -m.index) for m in self.messages]
            self.ring_hosts = ""
        else:
            self.servers, self.colocated = 0, False
            self.buckets = ddp_buckets(self.layout, int(a.bucket_mb * 2**20),
                                       int(a.first_bucket_mb * 2**20))
            for b, (_, layer) in enumerate(self.buckets):
                self.ready_after[layer].append(b)
            mode = a.ring_hosts
            if mode == "auto":
                mode = "full" if self.workers <= RING_FULL_MAX else "pair"
            self.ring_hosts = mode if self.workers > 1 else "full"
        self.host_count = self.workers + (0 if self.colocated else self.servers)
        if self.ring_hosts == "pair":
            self.host_count = 2
        self.tx = [0] * self.host_count
        self.rx = [0] * self.host_count

    def push_box(self, rank, shard):
        return self.sg.Mailbox.by_name(f"push-{rank}-{shard}")

    def pull_box(self, shard, rank):
        return self.sg.Mailbox.by_name(f"pull-{shard}-{rank}")

    # Hosts: workers 0..W-1, then dedicated servers; a colocated shard s is on worker s.
    def server_host_index(self, shard):
        return shard if self.colocated else self.workers + shard

    def host_name(self, i):
        return f"w{i}" if i < self.workers else f"s{i - self.workers}"

    def latency(self, rank, shard):
        return 0.0 if self.server_host_index(shard) == rank else self.delay_s

    def count(self, src, dst, size, step, from_server=False):
        """Bytes over host links in the measured steps."""
        if self.a.protocol == "ps" and not from_server:
            dst = self.server_host_index(dst)
        if src == dst or not (self.a.warmup_steps <= step < self.steps - 1):
            return
        self.tx[src] += size
        self.rx[dst] += size

    def platform(self):
        sg = self.sg
        bytes_per_s = (self.bps or UNSHAPED_BPS) / 8
        zone = sg.NetZone.create_star_zone("switch")
        hosts = []
        for i in range(self.host_count):
            host = zone.create_host(self.host_name(i), 1e9).seal()
            link = zone.create_split_duplex_link(f"link-{i}", bytes_per_s)
            link.set_latency(self.delay_s / 2).seal()
            zone.add_route(host.netpoint, None, None, None,
                           [sg.LinkInRoute(link, sg.LinkInRoute.Direction.UP)], True)
            loopback = zone.create_link(f"lo-{i}", UNSHAPED_BPS / 8).set_latency(0.0).seal()
            zone.add_route(host.netpoint, host.netpoint, None, None,
                           [sg.LinkInRoute(loopback)], False)
            hosts.append(host)
        zone.seal()
        return hosts

    def run(self):
        sg, a = self.sg, self.a
        engine = sg.Engine([
            "simulate", "--log=root.thres:critical",
            "--cfg=network/model:CM02", f"--cfg=network/bandwidth-factor:{a.wire}",
            "--cfg=network/latency-factor:1", "--cfg=network/weight-S:0",
            "--cfg=network/crosstraffic:0", f"--cfg=network/TCP-gamma:{a.tcp_window}",
            "--cfg=network/optim:Lazy",
        ])
        hosts = self.platform()
        if a.protocol == "ps":
            # A mailbox per connection (its messages in order, as TCP's), with
            # its receiver set so that data flows before the receiver asks.
            # Shards the plan leaves empty (more shards than messages) take
            # no part, as in the worker.
            self.shards_of_worker = sorted({m.shard for m in self.messages})
            self.request_box = [sg.Mailbox.by_name(f"pull-requests-{s}")
                                for s in range(self.servers)]
            workers = [PsWorker(self, r) for r in range(self.workers)]
            for r, w in enumerate(workers):
                actor = sg.Actor.create(f"worker-{r}", hosts[r], w.start, sg)
                for s in self.shards_of_worker:
                    self.pull_box(s, r).set_receiver(actor)
            for s in self.shards_of_worker:
                actor = sg.Actor.create(f"shard-{s}", hosts[self.server_host_index(s)],
                                        PsShard(self, s).start, sg)
                self.request_box[s].set_receiver(actor)
                for r in range(self.workers):
                    self.push_box(r, s).set_receiver(actor)
        else:
            n = 2 if self.ring_hosts == "pair" else self.workers
            self.ring_box = [sg.Mailbox.by_name(f"ring-{r}") for r in range(n)]
            workers = [RingWorker(self, r, (r + 1) % n, n) for r in range(n)]
            for r, w in enumerate(workers):
                actor = sg.Actor.create(f"worker-{r}", hosts[r], w.start, sg)
                self.ring_box[r].set_receiver(actor)
        started = time.monotonic()
        engine.run()
        self.wall_s = time.monotonic() - started
        self.sim_time_s = engine.clock
        return workers[0]

    def bounds(self):
        """(payload_bound_s, busiest bytes one way per step) for the protocol."""
        M, W, S = self.layout.model_bytes, self.workers, self.servers
        if self.a.protocol == "ring":
            busiest = 2 * (W - 1) / W * M
        elif self.colocated:
            busiest = max(M if W > S else 0, M * (S - 1) / S + (W - 1) * M / S)
        else:
            busiest = max(M, W * M / S)
        return busiest * 8 / (self.bps or UNSHAPED_BPS), busiest


def simulate(a):
    profile = model_profile.load(a.profile)
    sim = Simulation(a, profile)
    w0 = sim.run()
    starts = w0.step_starts
    first = min(a.warmup_steps, len(starts) - 2)
    window_steps = len(starts) - 1 - first
    window_s = starts[-1] - starts[first]
    step = window_s / window_steps
    compute = sim.layout.compute_s
    payload_bound, _ = sim.bounds()
    link_bound = payload_bound / a.wire
    bound = max(compute, link_bound)
    bps = sim.bps or UNSHAPED_BPS
    hosts = [{"host": sim.host_name(i), "tx_bytes": sim.tx[i], "rx_bytes": sim.rx[i],
              "tx_utilisation": sim.tx[i] * 8 / (window_s * bps) if window_s else None,
              "rx_utilisation": sim.rx[i] * 8 / (window_s * bps) if window_s else None}
             for i in range(sim.host_count)]
    links = [(h[f"{d}_utilisation"], f"{h['host']} {d}") for h in hosts for d in ("tx", "rx")
             if h[f"{d}_utilisation"] is not None]
    busiest_util, busiest_link = max(links) if links else (None, None)
    batch = a.batch_per_worker or profile["batch_size"]
    row = {
        "run": "simulated", "workers": a.workers, "servers": sim.servers, "rate": a.rate,
        "rate_bits_per_second": sim.bps, "delay_ms": a.delay, "delay_method": "simgrid",
        "congestion": "max-min", "model": profile["model"], "compute": "profile",
        "replay_step_s": compute, "global_batch_size": batch * a.workers, "steps": a.steps,
        "model_parameters": sim.layout.parameters,
        "samples_per_second": batch * a.workers / step if step else None,
        "warmup_steps": first, "window_steps": window_steps, "step_time_s": step,
        "model_bytes": sim.layout.model_bytes, "window_s": window_s,
        "max_link_utilisation": busiest_util, "busiest_link": busiest_link,
        "link_bound_s": link_bound,
        "step_over_link_bound": step / link_bound if link_bound else None,
        "payload_bound_s": payload_bound,
        "step_over_payload_bound": step / payload_bound if payload_bound else None,
        "split_compute": round(min(1.0, compute / step), 4) if step else None,
        "split_wait": round(max(0.0, 1 - compute / step), 4) if step else None,
        "protocol": a.protocol, "placement": a.placement if a.protocol == "ps" else "",
        "shard_plan": a.shard_plan if a.protocol == "ps" else "",
        "compute_s": compute, "bound_s": bound, "step_over_bound": step / bound if bound else None,
        "messages": len(sim.messages) if a.protocol == "ps" else len(sim.buckets),
        "ring_hosts": sim.ring_hosts, "profile": shown_path(a.profile),
        "sim_time_s": sim.sim_time_s, "sim_wall_s": round(sim.wall_s, 3),
    }
    return row, hosts


def shown_path(path):
    """A profile's path as rows show it: from the repository's root when
    inside it, so rows compare between checkouts."""
    full = os.path.abspath(path)
    return os.path.relpath(full, REPO) if full.startswith(REPO + os.sep) else path


def write_csv(path, row):
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RESULT_FIELDS + SIM_FIELDS)
        if new:
            w.writeheader()
        w.writerow(row)


def describe(row):
    what = (f"{row['protocol']} {row['placement']} S={row['servers']}" if row["protocol"] == "ps"
            else f"ring ({row['ring_hosts']})")
    return (f"simulate: {row['model']} {what} W={row['workers']} {row['rate']} "
            f"d={row['delay_ms']} ms: step {1000 * row['step_time_s']:.2f} ms = "
            f"{row['step_over_bound']:.3f} x bound {1000 * row['bound_s']:.2f} ms (compute "
            f"{1000 * row['compute_s']:.2f}, links {1000 * row['link_bound_s']:.2f}), "
            f"{row['samples_per_second']:.1f} samples/s; busiest {row['busiest_link']} "
            f"{row['max_link_utilisation'] or 0:.2f}; {row['sim_wall_s']:.1f} s to simulate")


CONFIG_FLAGS = ("protocol", "placement", "shard_plan", "workers", "servers", "rate", "delay",
                "profile")


# The default sweep (--sweep with none of CONFIG_FLAGS): ResNet-50 behind
# 10 Gbit/s with its profile's compute x 0.01 (about an accelerator's: 17 ms
# for a batch of 4, so that the links matter), W = 2 ... 512: the ring
# against the PS on W dedicated server hosts (round-robin shards, BytePS's
# setting) and on W/8 (round-robin and range shards); the colocated PS only
# to 64 workers (its W x S connections cost the simulator W^2). About 7
# minutes on this 2-core VM.
DEFAULT_SERIES = [
    {"protocol": "ring", "workers": SWEEP_WORKERS},
    {"protocol": "ps", "placement": "dedicated", "shard_plan": "round_robin", "servers": "W",
     "workers": SWEEP_WORKERS},
    {"protocol": "ps", "placement": "dedicated", "shard_plan": "round_robin", "servers": "W/8",
     "workers": SWEEP_WORKERS},
    {"protocol": "ps", "placement": "dedicated", "shard_plan": "range", "servers": "W/8",
     "workers": SWEEP_WORKERS},
    {"protocol": "ps", "placement": "colocated", "shard_plan": "range", "servers": "W",
     "workers": "2,4,8,16,32,64"},
]
DEFAULT_COMPUTE_SCALE = 0.01
DEFAULT_SWEEP = {"rate": "10gbit", "delay": "0",
                 "profile": os.path.join(HERE, "profiles", "resnet50.json")}


def servers_for(token, workers):
    """--servers in a sweep: a count, W (as many as workers) or W/k."""
    if token == "W":
        return workers
    if token.startswith("W/"):
        return max(1, workers // int(token[2:]))
    return int(token)


def sweep(a, argv):
    """Every combination of the comma-separated CONFIG_FLAGS (or the default
    series), each in a process of its own."""
    out = a.out or "."
    os.makedirs(out, exist_ok=True)
    path = a.csv or os.path.join(out, "sim.csv")
    given = {x.split("=")[0].lstrip("-") for x in argv} & set(CONFIG_FLAGS)
    if given:
        series = [{k: str(getattr(a, k)) for k in CONFIG_FLAGS}]
    else:
        series = [dict({k: str(getattr(a, k)) for k in CONFIG_FLAGS}, **DEFAULT_SWEEP, **s)
                  for s in DEFAULT_SERIES]
    passthrough = [x for x in argv if x.split("=")[0].lstrip("-") not in
                   CONFIG_FLAGS + ("sweep", "out", "csv", "json")]
    if not given and not any(x.startswith("--compute_") for x in argv):
        passthrough.append(f"--compute_scale={DEFAULT_COMPUTE_SCALE}")
    started, n, seen = time.monotonic(), 0, set()
    for values in series:
        for combo in itertools.product(*(values[k].split(",") for k in CONFIG_FLAGS)):
            c = dict(zip(CONFIG_FLAGS, combo))
            c["servers"] = str(servers_for(c["servers"], int(c["workers"])))
            if c["protocol"] == "ring":
                c["servers"], c["placement"], c["shard_plan"] = "0", "dedicated", "range"
            if c["protocol"] == "ps" and c["placement"] == "colocated" and \
                    int(c["servers"]) > int(c["workers"]):
                continue
            key = tuple(sorted(c.items()))
            if key in seen:
                continue
            seen.add(key)
            args = [sys.executable, os.path.abspath(__file__)] + \
                [f"--{k}={v}" for k, v in c.items()] + passthrough + [f"--csv={path}"]
            r = subprocess.run(args, capture_output=True, text=True)
            sys.stdout.write(r.stdout)
            sys.stdout.flush()
            if r.returncode:
                sys.stderr.write(r.stderr[-3000:])
                return r.returncode
            n += 1
    print(f"sweep: {n} configurations in {time.monotonic() - started:.1f} s; rows in {path}")
    return 0


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", default="ps", help="ps or ring")
    p.add_argument("--placement", default="dedicated",
                   help="ps: dedicated server hosts, or colocated (shard s on worker host s)")
    p.add_argument("--workers", default="2")
    p.add_argument("--servers", default="1", help="ps shards (W: as many as workers)")
    p.add_argument("--rate", default="1gbit", help="each host's link, each way: 100mbit, 1gbit, "
                   "10gbit, ... or unshaped (model.py's 12.6 Gbit/s)")
    p.add_argument("--delay", default="0", help="one-way ms between two hosts (float)")
    p.add_argument("--profile", default=os.path.join(HERE, "profiles", "resnet50.json"))
    p.add_argument("--batch_per_worker", type=int, default=0,
                   help="samples per worker and step: scales the profile's times linearly "
                   "[the profile's batch_size]")
    p.add_argument("--compute_scale", type=float, default=1.0,
                   help="multiplies every layer's time (e.g. 0.02 for a device 50 x this CPU)")
    p.add_argument("--compute_ms", type=float, default=None,
                   help="scale the layers so a pass takes this long (as run.sh's replay "
                   "does with its measured pass); overrides the two above")
    p.add_argument("--shard_plan", default="range",
                   help="ps: contiguous ranges (the worker's shard_plan.h) or messages dealt "
                   "to the shards in turn (BytePS)")
    p.add_argument("--chunk_bytes", type=int, default=CHUNK_BYTES)
    p.add_argument("--max_bytes_in_flight", type=int, default=32_000_000,
                   help="ps: each way, per worker (0: no bound)")
    p.add_argument("--bucket_mb", type=float, default=25.0, help="ring: DDP's bucket_cap_mb")
    p.add_argument("--first_bucket_mb", type=float, default=1.0,
                   help="ring: DDP's first bucket (1 MiB)")
    p.add_argument("--ring_hosts", default="auto", choices=("auto", "full", "pair"))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup_steps", type=int, default=1)
    p.add_argument("--wire", type=float, default=1 / WIRE,
                   help="payload share of a link's rate [1448/1514]")
    p.add_argument("--tcp_window", type=int, default=TCP_WINDOW,
                   help="bytes a flow may have in flight (SimGrid's TCP-gamma)")
    p.add_argument("--csv", default="", help="append the row here (header when new)")
    p.add_argument("--json", default="", help="write the row and each host's bytes here")
    p.add_argument("--sweep", action="store_true",
                   help="every combination of comma-separated --protocol, --placement, "
                   "--workers, --servers, --rate, --delay, --profile")
    p.add_argument("--out", default="", help="--sweep: folder of sim.csv [.]")
    return p


def main(argv):
    a = parser().parse_args(argv)
    if a.sweep:
        return sweep(a, argv)
    try:
        a.workers, a.servers, a.delay = int(a.workers), int(a.servers), float(a.delay)
        if a.delay == int(a.delay):
            a.delay = int(a.delay)
        if a.protocol not in ("ps", "ring") or a.placement not in ("dedicated", "colocated") \
                or a.shard_plan not in ("range", "round_robin"):
            raise ValueError("--protocol is ps or ring; --placement dedicated or colocated; "
                             "--shard_plan range or round_robin")
        if a.workers < 1 or a.servers < (1 if a.protocol == "ps" else 0) or a.delay < 0:
            raise ValueError("--workers >= 1, --servers >= 1 (ps), --delay >= 0")
        if a.steps < 2 or not 0 <= a.warmup_steps < a.steps - 1:
            raise ValueError("--steps >= 2 and 0 <= --warmup_steps < --steps - 1")
        if not 0 < a.wire <= 1:
            raise ValueError("--wire is in (0, 1]")
        row, hosts = simulate(a)
    except (ValueError, model_profile.ProfileError) as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    print(describe(row))
    if a.csv:
        write_csv(a.csv, row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(row, hosts=hosts), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
