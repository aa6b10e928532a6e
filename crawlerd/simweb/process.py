"""Run simweb in a subprocess for tests, the demo and benchmarks (Scrapy's mock-server pattern).

    with SimWebProcess(hosts=50, seed=7) as sim:
        sim.seeds, sim.static_hosts, sim.port        # from the announcement line
        entries = sim.ledger()                       # list[LedgerEntry]
        site = sim.site()                            # the site description (dict)

The control port is spoken to with http.client directly (not urllib), so no proxy from the
environment is ever consulted: the request goes to 127.0.0.1 and nowhere else.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import IO

from crawlerd.simweb.ledger import LedgerEntry, entries_from_json

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 180.0


class SimWebError(RuntimeError):
    pass


class SimWebProcess:
    """A simweb subprocess. Invariant: after ``start()`` returns, the server is listening and
    ``port``/``seeds``/``hosts``/``static_hosts`` describe it; ``stop()`` is idempotent."""

    def __init__(self, hosts: int = 200, seed: int = 1, bind: str = "127.0.0.1", port: int = 0,
                 ledger_out: str = "", min_pages: int | None = None, max_pages: int | None = None,
                 dns_port: int | None = None, profile: str | None = None, tls: bool = False,
                 extra_args: list[str] | None = None,
                 stderr: IO | int | None = None) -> None:
        args = ["--hosts", str(hosts), "--seed", str(seed), "--bind", bind, "--port", str(port)]
        if ledger_out:
            args += ["--ledger-out", ledger_out]
        if min_pages is not None:
            args += ["--min-pages", str(min_pages)]
        if max_pages is not None:
            args += ["--max-pages", str(max_pages)]
        if dns_port is not None:
            args += ["--dns-port", str(dns_port)]
        if profile is not None:
            args += ["--profile", profile]
        if tls:
            args.append("--tls")
        self.args = args + list(extra_args or [])
        self.stderr = stderr
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self.returncode: int | None = None

    # --- lifecycle ---
    def start(self) -> SimWebProcess:
        cmd = [sys.executable, "-m", "crawlerd.simweb", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.stderr,
                                     stdin=subprocess.DEVNULL)
        line = self._read_announcement()
        try:
            self.info = json.loads(line)
        except ValueError as e:
            self.stop()
            raise SimWebError(f"simweb announced garbage: {line[:200]!r}") from e
        return self

    def _read_announcement(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + START_TIMEOUT_S
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                raise SimWebError(f"simweb did not announce itself within {START_TIMEOUT_S:.0f}s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                rc = self.proc.wait(timeout=STOP_TIMEOUT_S)
                raise SimWebError(f"simweb exited with status {rc} before listening (args: {self.args})")
            buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    def stop(self) -> int | None:
        """SIGTERM, wait (the ledger is written if --ledger-out was given), SIGKILL if it hangs."""
        proc = self.proc
        if proc is None:
            return self.returncode
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        self.returncode = proc.returncode
        self.proc = None
        return self.returncode

    def __enter__(self) -> SimWebProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- announcement ---
    @property
    def port(self) -> int:
        return self.info["port"]

    @property
    def control_port(self) -> int:
        return self.info["control_port"]

    @property
    def bind(self) -> str:
        return self.info["bind"]

    @property
    def seeds(self) -> list[str]:
        return self.info["seeds"]

    @property
    def hosts(self) -> dict[str, str]:
        return self.info["hosts"]

    @property
    def static_hosts(self) -> dict[str, str]:
        return self.info["static_hosts"]

    @property
    def ca_file(self) -> str | None:
        """The throwaway CA's certificate (PEM) when serving HTTPS, else None."""
        return self.info.get("ca_file")

    @property
    def dns_port(self) -> int | None:
        return self.info.get("dns_port")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    # --- control port ---
    def _control(self, method: str, path: str) -> dict:
        # the site of 20,000 hosts is a large answer: on a loaded box it takes more than 30 s
        conn = http.client.HTTPConnection("127.0.0.1", self.control_port, timeout=CONTROL_TIMEOUT_S)
        try:
            conn.request(method, path, headers={"Content-Length": "0"} if method == "POST" else {})
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            raise SimWebError(f"control {method} {path}: HTTP {resp.status}: {body[:200]!r}")
        return json.loads(body)

    def ledger(self, since: int = 0) -> list[LedgerEntry]:
        return entries_from_json(self._control("GET", f"/ledger?since={since}")["entries"])

    def site(self) -> dict:
        return self._control("GET", "/site")

    def reset_ledger(self) -> int:
        return self._control("POST", "/reset-ledger")["cleared"]

    def health(self) -> dict:
        return self._control("GET", "/health")
