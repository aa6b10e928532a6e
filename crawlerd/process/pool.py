"""Processing worker pool: N processes do the CPU work on fetched responses.

Each worker is a ``python -m crawlerd.process.pool --fd N`` child joined to the
crawl process by a Unix socketpair carrying length-prefixed pickles. The first
frame configures its :class:`PageProcessor` and its own WARC writer (segment
files named with the worker's shard tag, so workers never share a file).

Key: job id -> job. Invariant: a submitted job is in exactly one worker's
``outstanding`` map until its result comes back; then its future is resolved
exactly once. A worker that dies is restarted and its outstanding jobs are
sent again in order; a job that has now been outstanding in
``max_job_attempts`` dead workers resolves with outcome ``process_crashed``
(poison page) — none is silently lost.

Backpressure: ``process()`` waits for a free slot (``jobs_per_worker`` per
worker); the shard keeps the lease slot of a response until it is processed, so
a slow pool stops new fetches instead of growing a queue.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass, field

from crawlerd.metrics import proc_cpu_s
from crawlerd.outcome import Outcome
from crawlerd.records import FetchResult, ProcessResult

log = logging.getLogger("crawlerd.pool")

_LEN = struct.Struct("!I")
MAX_FRAME = 1 << 30


def default_workers(configured: int) -> int:
    """``process.workers``: 0 means cores - 1, at least 1."""
    if configured > 0:
        return configured
    return max(1, (os.cpu_count() or 2) - 1)


@dataclass
class _Job:
    job_id: int
    result: FetchResult
    prior: tuple[str, float] | None
    future: asyncio.Future
    attempts: int = 0


@dataclass
class _Worker:
    index: int
    generation: int
    proc: subprocess.Popen
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    outstanding: dict[int, _Job] = field(default_factory=dict)
    segment: str = ""          # last segment file reported (for crash recovery)
    reader_task: asyncio.Task | None = None


class WorkerPool:
    def __init__(self, workers: int, init: dict, *, jobs_per_worker: int = 8, max_job_attempts: int = 2,
                 on_worker_death=None):
        self.n = workers
        self.init = init
        self.jobs_per_worker = jobs_per_worker
        self.max_job_attempts = max_job_attempts
        self.on_worker_death = on_worker_death
        self._workers: list[_Worker | None] = [None] * workers
        self._slots = asyncio.Semaphore(workers * jobs_per_worker)
        self._next_id = 0
        self._closing = False
        self.restarts = 0
        self.crashed_jobs = 0
        self.final_cpu_s: dict[int, float] = {}     # worker pid -> CPU s, read just before it exits

    async def start(self) -> None:
        for i in range(self.n):
            self._workers[i] = await self._spawn(i, 0)

    async def _spawn(self, index: int, generation: int) -> _Worker:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        init = dict(self.init, worker_tag=f"{self.init.get('shard', '0')}-w{index}")
        proc = subprocess.Popen([sys.executable, "-m", "crawlerd.process.pool", "--fd", str(child.fileno())],
                                pass_fds=[child.fileno()], stdin=subprocess.DEVNULL)
        child.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent, limit=1 << 20)
        w = _Worker(index, generation, proc, reader, writer)
        _send(writer, ("init", init))
        w.reader_task = asyncio.ensure_future(self._read_results(w))
        return w

    @property
    def workers(self) -> list[_Worker]:
        return [w for w in self._workers if w is not None]

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    def cpu_s(self) -> dict[int, float]:
        """CPU seconds per worker process (live, or as last read before exit)."""
        out = dict(self.final_cpu_s)
        for w in self.workers:
            cpu = proc_cpu_s(w.proc.pid)
            if cpu is not None:
                out[w.proc.pid] = cpu
        return out

    def outstanding(self) -> int:
        return sum(len(w.outstanding) for w in self.workers)

    async def process(self, result: FetchResult, prior: tuple[str, float] | None = None) -> ProcessResult:
        """Process one response in a worker; waits for a free slot (backpressure)."""
        async with self._slots:
            loop = asyncio.get_running_loop()
            self._next_id += 1
            job = _Job(self._next_id, result, prior, loop.create_future())
            self._dispatch(job)
            return await job.future

    def _dispatch(self, job: _Job) -> None:
        w = min(self.workers, key=lambda w: len(w.outstanding))
        w.outstanding[job.job_id] = job
        job.attempts += 1
        _send(w.writer, ("job", job.job_id, job.result, job.prior))

    async def _read_results(self, w: _Worker) -> None:
        try:
            while True:
                msg = await _recv(w.reader)
                if msg is None:
                    break
                _kind, job_id, pr, segment = msg
                if segment:
                    w.segment = segment
                job = w.outstanding.pop(job_id, None)
                if job is not None and not job.future.done():
                    job.future.set_result(pr)
        except (ConnectionError, asyncio.IncompleteReadError, pickle.UnpicklingError, EOFError) as e:
            log.warning("worker %d connection lost: %r", w.index, e)
        if not self._closing:
            await self._restart(w)

    async def _restart(self, dead: _Worker) -> None:
        with contextlib.suppress(Exception):
            dead.writer.close()
        rc = await asyncio.get_running_loop().run_in_executor(None, _reap, dead.proc)
        self.restarts += 1
        log.error("worker %d died (exit %s) with %d jobs; restarting", dead.index, rc, len(dead.outstanding))
        if self.on_worker_death is not None:
            self.on_worker_death(dead.index, dead.segment)
        fresh = await self._spawn(dead.index, dead.generation + 1)
        self._workers[dead.index] = fresh
        for job in sorted(dead.outstanding.values(), key=lambda j: j.job_id):
            if job.attempts >= self.max_job_attempts:
                self.crashed_jobs += 1
                if not job.future.done():
                    job.future.set_result(ProcessResult(url=job.result.url, outcome=Outcome.PROCESS_CRASHED,
                                                        status=job.result.status,
                                                        error="worker died processing this response"))
            else:
                self._dispatch(job)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Let workers finish their jobs, close their WARC segments and exit."""
        self._closing = True
        pending = [j.future for w in self.workers for j in w.outstanding.values()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        for w in self.workers:
            cpu = proc_cpu_s(w.proc.pid)
            if cpu is not None:
                self.final_cpu_s[w.proc.pid] = cpu
            with contextlib.suppress(Exception):
                _send(w.writer, ("close",))
                await w.writer.drain()
        loop = asyncio.get_running_loop()
        for w in self.workers:
            try:
                await asyncio.wait_for(loop.run_in_executor(None, w.proc.wait), timeout_s)
            except TimeoutError:
                w.proc.kill()
                await loop.run_in_executor(None, w.proc.wait)
            if w.reader_task is not None:
                w.reader_task.cancel()
            with contextlib.suppress(Exception):
                w.writer.close()


def _reap(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _send(writer: asyncio.StreamWriter, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_LEN.pack(len(data)) + data)


async def _recv(reader: asyncio.StreamReader):
    try:
        head = await reader.readexactly(_LEN.size)
    except asyncio.IncompleteReadError:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise pickle.UnpicklingError(f"frame of {n} bytes")
    return pickle.loads(await reader.readexactly(n))


# -- the worker process ---------------------------------------------------------------------
def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def worker_main(fd: int) -> int:
    import signal

    from crawlerd.process.worker import PageProcessor
    from crawlerd.store.warc import WarcWriter
    # the crawl process runs the ordered shutdown; a worker ends when its socket closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    processor: PageProcessor | None = None
    warc: WarcWriter | None = None
    try:
        while True:
            head = _read_exact(sock, _LEN.size)
            if head is None:
                break
            body = _read_exact(sock, _LEN.unpack(head)[0])
            if body is None:
                break
            msg = pickle.loads(body)
            if msg[0] == "init":
                init = msg[1]
                warc = WarcWriter(init["warc_dir"], prefix=init["prefix"], segment_max_bytes=init["segment_max_bytes"],
                                  shard=init["worker_tag"], user_agent=init["user_agent"],
                                  **({"index_dir": init["index_dir"]} if init.get("index_dir") else {}))
                processor = PageProcessor(warc, agent_token=init["agent_token"],
                                          max_decoded_bytes=init["max_decoded_bytes"], max_links=init["max_links"])
            elif msg[0] == "job":
                _, job_id, result, prior = msg
                try:
                    pr = processor.process(result, prior=prior)
                except Exception as e:  # a bug must not take the page with it: record it by name
                    pr = ProcessResult(url=result.url, outcome=Outcome.PROCESS_ERROR, status=result.status,
                                       error=f"{type(e).__name__}: {e}")
                warc.flush()    # a crash of this worker then loses at most the record being written
                data = pickle.dumps(("result", job_id, pr, warc.current_path or ""),
                                    protocol=pickle.HIGHEST_PROTOCOL)
                sock.sendall(_LEN.pack(len(data)) + data)
            elif msg[0] == "close":
                break
    finally:
        if warc is not None:
            warc.close()
        sock.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="crawlerd processing worker (started by the crawl process)")
    ap.add_argument("--fd", type=int, required=True)
    args = ap.parse_args()
    return worker_main(args.fd)


if __name__ == "__main__":
    raise SystemExit(main())
