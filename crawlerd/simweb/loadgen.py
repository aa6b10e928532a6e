"""Benchmark simweb's request rate and server CPU per request against a same-run baseline.

    nice -n 10 .venv/bin/python -m crawlerd.simweb.loadgen --runs 5 --requests 6000 --conns 8

Each run starts a fresh simweb subprocess and a baseline subprocess (a bare uvloop server that
answers every request with one fixed 17 KB body: the floor any HTTP server on this loop pays),
then drives both with the same keep-alive client load, bounded in count and time. Workloads:
``cold`` (every request a page not yet served: rendering cost), ``warm`` (a small working set:
cache hits). Reported: medians over runs of requests/s and server CPU µs/request (from
/proc/PID/stat), and their ratios to the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time

from crawlerd.simweb.process import SimWebProcess

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


# --- the baseline server ---

class _Fixed(asyncio.Protocol):
    BODY = b"x" * 17000
    RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 17000\r\n\r\n") + BODY

    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""

    def data_received(self, data):
        self.buf += data
        while (i := self.buf.find(b"\r\n\r\n")) >= 0:
            self.buf = self.buf[i + 4:]
            self.transport.write(self.RESPONSE)


async def _serve_baseline() -> None:
    server = await asyncio.get_running_loop().create_server(_Fixed, "127.0.0.1", 0)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await asyncio.Event().wait()


# --- the client ---

async def _client(port: int, targets: list[tuple[str, str]], deadline: float) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    try:
        for host, path in targets:
            if time.monotonic() > deadline:
                break
            req = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: loadgen\r\n\r\n"
            writer.write(req.encode())
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            done += 1
    finally:
        writer.close()
    return done


async def drive(port: int, targets: list[tuple[str, str]], conns: int, max_s: float) -> tuple[int, float]:
    """Spread targets over ``conns`` keep-alive connections; returns (requests done, seconds)."""
    parts = [targets[i::conns] for i in range(conns)]
    t0 = time.monotonic()
    counts = await asyncio.gather(*(_client(port, p, t0 + max_s) for p in parts))
    return sum(counts), time.monotonic() - t0


def workload(kind: str, site: dict, n: int, rng: random.Random) -> list[tuple[str, str]]:
    """(host, path) pairs on ordinary hosts: ``cold`` never repeats a page, ``warm`` cycles 200."""
    hosts = [(name, h["pages"]) for name, h in site["hosts"].items()
             if h["role"] == "normal" and not h["robots"]["unavailable"]]
    if kind == "warm":
        chosen = rng.sample(hosts, min(20, len(hosts)))
        pool = [(name, f"/p/{rng.randrange(pages)}.html") for name, pages in chosen for _ in range(10)]
        return [pool[i % len(pool)] for i in range(n)]
    every = [(name, f"/p/{k}.html") for name, pages in hosts for k in range(pages)]
    rng.shuffle(every)
    return every[:n]


def _measure(port: int, pid: int, targets, conns: int, max_s: float) -> dict:
    c0 = cpu_s(pid)
    done, secs = asyncio.run(drive(port, targets, conns, max_s))
    cpu = cpu_s(pid) - c0
    return {"requests": done, "rps": done / secs, "server_cpu_us_per_req": 1e6 * cpu / max(done, 1)}


def one_run(args: argparse.Namespace, seed: int) -> dict:
    rng = random.Random(seed)
    out = {}
    base = subprocess.Popen([sys.executable, "-m", "crawlerd.simweb.loadgen", "--serve-baseline"],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        base_port = json.loads(base.stdout.readline())["port"]
        with SimWebProcess(hosts=args.hosts, seed=seed) as sim:
            site = sim.site()
            for kind in ("cold", "warm"):
                targets = workload(kind, site, args.requests, rng)
                out[kind] = _measure(sim.port, sim.pid, targets, args.conns, args.max_s)
            # the baseline ignores the path; same host/path mix keeps the client's work equal
            out["baseline"] = _measure(base_port, base.pid, workload("warm", site, args.requests, rng),
                                       args.conns, args.max_s)
    finally:
        base.terminate()
        base.wait(timeout=10)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m crawlerd.simweb.loadgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--requests", type=int, default=6000, help="requests per workload per run")
    p.add_argument("--conns", type=int, default=8, help="keep-alive client connections")
    p.add_argument("--hosts", type=int, default=200)
    p.add_argument("--max-s", type=float, default=30.0, help="time bound per workload")
    p.add_argument("--serve-baseline", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_baseline:
        try:
            import uvloop
            uvloop.run(_serve_baseline())
        except KeyboardInterrupt:
            pass
        return 0
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    runs = [one_run(args, seed) for seed in range(1, args.runs + 1)]
    report = {}
    for kind in ("cold", "warm", "baseline"):
        rps = statistics.median(r[kind]["rps"] for r in runs)
        cpu = statistics.median(r[kind]["server_cpu_us_per_req"] for r in runs)
        report[kind] = {"rps_median": round(rps), "server_cpu_us_per_req_median": round(cpu, 1)}
    for kind in ("cold", "warm"):
        report[kind]["rps_ratio_to_baseline"] = round(
            statistics.median(r[kind]["rps"] / r["baseline"]["rps"] for r in runs), 3)
        report[kind]["cpu_ratio_to_baseline"] = round(statistics.median(
            r[kind]["server_cpu_us_per_req"] / r["baseline"]["server_cpu_us_per_req"] for r in runs), 2)
    report["runs"] = args.runs
    report["requests_per_workload"] = args.requests
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
