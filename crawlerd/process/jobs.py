"""What the processing pool holds: a ``process()`` call (``Job``) and a worker process's link (``WorkerLink``).

Shared by ``crawlerd.process.pool`` (which sends jobs and reads answers) and
``crawlerd.process.restart`` (which hands a dead worker's jobs on); neither reaches into the other.
"""

from __future__ import annotations

import asyncio
import mmap
import subprocess
from dataclasses import dataclass, field

from crawlerd._native.bodypool import PooledBody
from crawlerd.process.wire import AnswerReader
from crawlerd.records import FetchResult, PriorCapture


@dataclass(slots=True)
class Job:
    """One ``process()`` call in the pool (slots: one object the collector walks while it waits for
    its worker, not an instance and its ``__dict__``)."""

    job_id: int
    result: FetchResult
    prior: PriorCapture | None
    future: asyncio.Future
    digest: str = ""            # payload digest if the caller has it (saves the worker a pass)
    lookup: bool = False        # the worker finds the duplicate owner itself (pool module doc)
    sitemap: tuple[int, int] | None = None     # (max_urls, max_bytes): also read it as a sitemap
    crashes: int = 0            # workers that died while working on this job
    copy: PooledBody | None = None      # a heap body copied into the pool at dispatch
    ctx: object = None          # the caller's, handed to ``on_frame`` with the job's answer


def release_body(job: Job) -> None:
    """No worker holds ``job`` any more: its body's blocks go back (the fetcher's, or the copy)."""
    if job.copy is not None:
        job.copy.release()
    if job.result.pooled is not None:
        job.result.pooled.release()


@dataclass
class WorkerLink:
    """One worker process (slot ``index``, restarted as ``generation`` + 1) and the crawl process's end
    of its socket. Key: job id -> job in ``outstanding``, in the order sent."""

    index: int
    generation: int
    proc: subprocess.Popen
    transport: asyncio.Transport
    answers: AnswerReader
    progress: mmap.mmap          # the worker's progress page: the id of the job it started last
    outstanding: dict[int, Job] = field(default_factory=dict)   # in the order sent
    alive: bool = True
    segment: str = ""          # .open segment named in the last answer
    acked_bytes: int = 0       # its size once that answer's records were flushed
    answered: int = 0
    reader_task: asyncio.Task | None = None
    out: list[bytes] = field(default_factory=list)       # frames waiting for this iteration's write
    jobs: list[tuple] = field(default_factory=list)      # then its jobs with a pooled body, one frame
