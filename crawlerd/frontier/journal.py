"""The requests in flight, written down before they start: what a restart needs to stay polite.

The frontier's LMDB commits are grouped (a fsync per second, not per request), so after a
``kill -9`` the last commit does not say which hosts were being fetched, nor when the
requests finished since then ended. This journal does, cheaply: one unbuffered ``write`` per
lease batch and per completion, no fsync. A write that returned is in the kernel's page cache
and survives the death of the process (not an OS crash: the boot id in the header tells a
reboot, and then the frontier falls back to a whole grace for every host).

File ``<frontier dir>/inflight.log``, text lines, times in wall-clock seconds:

``H <boot id> <session>``           first line
``S <lease id> <start> <ip> <host key>``   a request may start now (written before lease() returns)
``E <lease id> <end> <due> [<key>]``  it ended at ``end``; its host is due again at ``due``;
                                   ``key`` (hex queue key) when its URL was completed
``I <ip> <end>``                   the last request to an address ended at ``end`` (its own gap,
                                   ``ip_delay_s``, counts from there)

Invariant: every lease out has its ``S`` line in the file; an ``S`` without its ``E`` is a
request that may have been in flight when the process died. An ``E`` with a key is written
after the answer was archived (its WARC record handed to the OS): the restart completes that
URL instead of fetching it again, so a kill -9 refetches only the requests in flight. The file is rewritten (temp name,
rename) after a frontier commit has made the ``E`` lines' dues durable in the host records,
keeping only the ``S`` lines of leases still out.

With a writer thread attached (``attach_writer``) an ``E`` line is handed to it and written
later, to the file that was current when it was handed over (a rotation hands the old file's
close to the same thread, after those lines); the lines of one group to one file go out in one
``writev``. ``S`` lines stay written before ``lease()``
returns. An ``E`` not written by a ``kill -9`` leaves its request looking in flight: its host
waits a whole gap and its URL is fetched again, never lost, never early.

When the frontier's commits land later than they are made (written on the writer thread), a
rotation cannot drop the lines written between the commit and its landing: ``mark()`` at the
commit starts keeping a copy of every line written from then on, and the rewrite once the commit
landed (``rewrite(..., tail=take_tail())``, with the leases and IP gaps of the commit's moment)
carries them over: the new file is the old one less the lines that commit made redundant.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from crawlerd.store.fsync import write_all
from crawlerd.store.writer import WriterError, WriteThread

FILE_NAME = "inflight.log"
ROTATE_BYTES = 1 << 20
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """This boot's id ("" when the OS does not tell): page-cache writes survive only within one boot."""
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(slots=True)
class Replay:
    """What a journal tells the next run. Key: host key (``inflight``, ``ended``), IP (``ip_end``).

    ``inflight``: hosts with a request that may have been in flight, mapped to the earliest
    start among them (wall clock). ``ended``: hosts whose requests ended after the last
    rotation, mapped to the latest due those set. ``ip_end``: the last end of a request to
    each IP, ``inf`` when one may have been in flight (it ended by the crash at the latest).
    ``completed``: queue keys of URLs completed after the last rotation.
    ``usable`` is False when there was no journal of this boot (then nothing is known).
    """

    usable: bool = False
    inflight: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    ip_end: dict[str, float] = field(default_factory=dict)
    completed: list[bytes] = field(default_factory=list)


def read(directory: str) -> Replay:
    """Parse the journal left in ``directory`` (torn last line and garbage skipped)."""
    path = os.path.join(directory, FILE_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return Replay()
    lines = data.decode("utf-8", "surrogateescape").split("\n")
    head = lines[0].split(" ") if lines else []
    me = boot_id()
    if len(head) < 2 or head[0] != "H" or not me or head[1] != me:
        return Replay()
    out = Replay(usable=True)
    starts: dict[str, tuple[float, str, str]] = {}
    for line in lines[1:-1]:            # the last piece has no newline yet: maybe torn
        parts = line.split(" ", 4)
        try:
            if parts[0] == "S" and len(parts) == 5:
                starts[parts[1]] = (float(parts[2]), parts[3], parts[4])
            elif parts[0] == "E" and len(parts) in (4, 5):
                start = starts.pop(parts[1], None)
                if start is not None:
                    if len(parts) == 5:
                        out.completed.append(bytes.fromhex(parts[4]))
                    _t0, ip, hk = start
                    end, due = float(parts[2]), float(parts[3])
                    if due > out.ended.get(hk, -1.0):
                        out.ended[hk] = due
                    if ip:
                        out.ip_end[ip] = max(out.ip_end.get(ip, 0.0), end)
            elif parts[0] == "I" and len(parts) == 3:
                out.ip_end[parts[1]] = max(out.ip_end.get(parts[1], 0.0), float(parts[2]))
        except ValueError:
            continue
    for t0, ip, hk in starts.values():
        out.inflight[hk] = min(t0, out.inflight.get(hk, t0))
        if ip:
            out.ip_end[ip] = float("inf")
    return out


class InflightJournal:
    """The open journal of this run (see the module docstring for the format and invariant)."""

    __slots__ = ("path", "_fd", "_size", "_session", "_boot", "_writer", "_write_failed", "_tail")

    def __init__(self, directory: str, session: int, ip_end: dict[str, float] | None = None):
        """Start this run's journal; ``ip_end``: IP gaps begun in the last run, still running."""
        self.path = os.path.join(directory, FILE_NAME)
        self._session = session
        self._boot = boot_id() or "-"
        self._fd = -1
        self._size = 0
        self._writer: WriteThread | None = None
        self._write_failed: OSError | None = None
        self._tail: list[str] | None = None     # the lines written since mark(), while one is pending
        self.rewrite([], ip_end or {})

    def attach_writer(self, writer: WriteThread | None) -> None:
        """Write ``E`` lines through ``writer`` (None: here again; the writer must be closed)."""
        self._writer = writer

    def _on_thread(self, items: list[tuple[int, bytes | None]]) -> None:
        # On the writer thread, in order: (fd, line) appends, (fd, None) closes a rotated file.
        # A group's lines to one file go out in one writev (one system call per group, not per
        # request); a close comes after every line handed over before it.
        run: list[bytes] = []
        run_fd = -1
        try:
            for fd, data in items:
                if data is not None and fd == run_fd:
                    run.append(data)
                    continue
                if run:
                    write_all(run_fd, run)
                    run.clear()
                if data is None:
                    run_fd = -1
                    os.close(fd)
                else:
                    run_fd = fd
                    run.append(data)
            if run:
                write_all(run_fd, run)
        except OSError as e:
            self._write_failed = e

    def mark(self) -> None:
        """A commit was made that lands later: keep a copy of the lines written from now on, for the
        rewrite once it landed (``take_tail``)."""
        self._tail = []

    @property
    def marked(self) -> bool:
        return self._tail is not None

    def take_tail(self) -> list[str]:
        tail, self._tail = self._tail or [], None
        return tail

    def _write(self, text: str) -> None:
        if self._tail is not None:
            self._tail.append(text)
        data = text.encode("utf-8", "surrogateescape")
        self._size += os.write(self._fd, data)

    def started(self, leases: list[tuple[int, float, str, str]]) -> None:
        """(lease id, wall start, ip, host key) of requests about to start."""
        self._write("".join(f"S {lid} {t!r} {ip or ''} {hk}\n" for lid, t, ip, hk in leases))

    def ended(self, lease_id: int, end: float, due: float, done_key: bytes | None = None) -> None:
        """A request ended; ``done_key``: its URL's queue key when the URL is completed."""
        tail = f" {done_key.hex()}" if done_key is not None else ""
        if self._writer is None:
            self._write(f"E {lease_id} {end!r} {due!r}{tail}\n")
            return
        if self._write_failed is not None:
            err, self._write_failed = self._write_failed, None
            raise err
        line = f"E {lease_id} {end!r} {due!r}{tail}\n"
        if self._tail is not None:
            self._tail.append(line)
        data = line.encode("utf-8", "surrogateescape")
        self._size += len(data)
        self._writer.submit(self._on_thread, (self._fd, data))

    def needs_rotation(self) -> bool:
        return self._size >= ROTATE_BYTES

    def rewrite(self, leases: list[tuple[int, float, str, str]], ip_end: dict[str, float],
                tail: list[str] = ()) -> None:
        """Start the file afresh with the leases still out and the IP gaps still running.

        Call only right after a commit landed (the dues of ended requests are then in the host
        records), with the leases and gaps as of that commit and the lines written since
        (``tail``; see the module docstring).
        """
        text = f"H {self._boot} {self._session}\n"
        text += "".join(f"S {lid} {t!r} {ip or ''} {hk}\n" for lid, t, ip, hk in leases)
        text += "".join(f"I {ip} {end!r}\n" for ip, end in ip_end.items())
        text += "".join(tail)
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            os.write(fd, text.encode("utf-8", "surrogateescape"))
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        if self._fd >= 0:
            if self._writer is None:
                os.close(self._fd)
            else:
                try:
                    self._writer.submit(self._on_thread, (self._fd, None))    # after its pending lines
                except WriterError:         # it stopped (closed: its lines are written; failed: lost)
                    os.close(self._fd)
        self._fd, self._size = fd, len(text)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
