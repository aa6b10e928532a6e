"""StorageHealth: a low free space or a failed write pauses; a probe write resumes; fatal is one line."""

import errno
import logging

from crawlerd.shard.storage import PROBE_NAME, StorageHealth


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def health(tmp_path, min_free=0):
    changes = []
    h = StorageHealth(str(tmp_path), min_free_bytes=min_free, probe_interval_s=5.0, clock=Clock(),
                      on_change=lambda: changes.append(h.reason))
    return h, changes


def test_low_free_space_pauses_and_resumes(tmp_path):
    h, changes = health(tmp_path, min_free=1 << 62)      # more than any disk has
    h.step(h.clock())
    assert h.paused and h.reason == f"disk full: {tmp_path}"
    h.min_free_bytes = 0                                  # space came back
    h.clock.t += 1.0
    h.step(h.clock())
    assert not h.paused and changes == [f"disk full: {tmp_path}", None]


def test_failed_write_pauses_until_a_probe_succeeds(tmp_path, caplog):
    h, changes = health(tmp_path)
    warc = tmp_path / "warc"
    warc.mkdir()
    with caplog.at_level(logging.INFO, logger="crawlerd.storage"):
        h.failed(OSError(errno.EROFS, "Read-only file system"), str(warc))
        h.failed(OSError(errno.EROFS, "Read-only file system"), str(warc))     # the same fault: one line
        assert h.reason == f"read-only: {warc}"
        h.clock.t += 1.0
        h.step(h.clock())
        assert h.paused                                   # the probe waits its interval
        h.clock.t += 5.0
        h.step(h.clock())                                 # the directory is writable: resumed
    assert not h.paused and not (warc / PROBE_NAME).exists()
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "read-only" in errors[0].getMessage()
    assert any("resumed" in r.getMessage() for r in caplog.records)
    assert changes == [f"read-only: {warc}", None] and h.faults == 1


def test_probe_of_a_directory_that_stays_broken_keeps_the_pause(tmp_path):
    h, _ = health(tmp_path)
    gone = tmp_path / "gone"                              # writes there fail (it does not exist)
    h.failed(OSError(errno.EIO, "Input/output error"), str(gone / "seg.warc.gz"))
    assert h.reason == f"I/O error: {gone / 'seg.warc.gz'}"
    assert not h.retry_now() and h.paused
    gone.mkdir()
    assert h.retry_now() and not h.paused


def test_messages_name_the_kind(tmp_path):
    h, _ = health(tmp_path)
    h.fatal(OSError(errno.ENOSPC, "No space left on device"), "frontier")
    assert h.fatal_reason.startswith(f"disk full: {tmp_path} (frontier: ")
    import lmdb
    h2, _ = health(tmp_path)
    h2.fatal(lmdb.DiskError("mdb_txn_commit: No space left on device"), "frontier")
    assert h2.fatal_reason.startswith("disk full: ")
