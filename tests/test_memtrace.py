"""The tracemalloc debug switch: off unless asked, snapshots on its interval, a diff that names what grew;
the workers' memory log: off unless asked, a line per interval with the pages served."""

import json
import os
import tracemalloc

import pytest

from crawlerd.memtrace import ENV, FRAMES_ENV, MEMLOG_ENV, START_ENV, MemLog, MemTrace, grown, series


@pytest.fixture
def untraced():
    yield
    tracemalloc.stop()


def test_off_unless_the_environment_asks_and_a_bad_value_is_named(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(ENV, raising=False)
    assert MemTrace.from_env(str(tmp_path / "t")) is None
    monkeypatch.setenv(ENV, "0")
    assert MemTrace.from_env(str(tmp_path / "t")) is None
    monkeypatch.setenv(ENV, "soon")
    with caplog.at_level("WARNING", logger="crawlerd.memtrace"):
        assert MemTrace.from_env(str(tmp_path / "t")) is None
    assert "CRAWLERD_TRACEMALLOC_S='soon' is not a number" in caplog.text
    assert not os.path.exists(tmp_path / "t")


def test_snapshots_on_the_interval_and_the_diff_finds_the_growth(tmp_path, monkeypatch, untraced):
    monkeypatch.setenv(ENV, "30")
    t = [100.0]
    tr = MemTrace.from_env(str(tmp_path / "t"), clock=lambda: t[0])
    assert tr is not None and tracemalloc.is_tracing()
    assert tr.maybe_dump(120.0) is None                  # not yet due
    first = tr.maybe_dump(130.0)
    kept = [bytes(1000) for _ in range(2000)]            # ~2 MB that stays live
    second = tr.maybe_dump(160.0)
    assert os.path.basename(first) < os.path.basename(second)    # named in time order
    lines = grown(first, second, top=5)
    assert float(lines[0].split()[1]) > 1500             # KiB grew in all
    assert "test_memtrace.py" in lines[1]                # the line above, first
    assert len(kept) == 2000


def test_tracing_starts_late_when_asked_and_a_traceback_names_the_callers(tmp_path, monkeypatch, untraced):
    # the warm-up runs untraced; what is allocated after the start and stays live is what shows,
    # with the frames above the allocating line; the type census beside each snapshot counts it too
    monkeypatch.setenv(ENV, "30")
    monkeypatch.setenv(START_ENV, "100")
    monkeypatch.setenv(FRAMES_ENV, "3")
    tracemalloc.stop()                                   # whatever an earlier test left on
    t = [0.0]
    tr = MemTrace.from_env(str(tmp_path / "t"), clock=lambda: t[0])
    assert not tracemalloc.is_tracing()
    assert tr.maybe_dump(50.0) is None and not tracemalloc.is_tracing()
    assert tr.maybe_dump(100.0) is None and tracemalloc.is_tracing()
    assert tr.maybe_dump(120.0) is None                  # the interval counts from the start
    first = tr.maybe_dump(130.0)

    class Grower:
        pass

    def keep():
        return [Grower() for _ in range(5000)]
    kept = keep()
    second = tr.maybe_dump(160.0)
    assert os.path.basename(second) == "0000160.snap"
    lines = grown(first, second, top=3, by="traceback")
    assert "test_memtrace.py" in lines[2] and "test_memtrace.py" in lines[3]    # the line, then its caller
    census = [x for x in lines if "Grower" in x]
    assert census and "+5000 objects" in census[0]
    assert any("test_memtrace.py" in x for x in series(str(tmp_path / "t"), top=3))
    assert len(kept) == 5000


def test_memory_log_is_off_unless_asked_then_writes_a_line_per_interval(tmp_path, monkeypatch):
    path = str(tmp_path / "log" / "w.jsonl")
    monkeypatch.delenv(MEMLOG_ENV, raising=False)
    assert MemLog.from_env(path) is None
    monkeypatch.setenv(MEMLOG_ENV, "0")
    assert MemLog.from_env(path) is None
    monkeypatch.setenv(MEMLOG_ENV, "10")
    log = MemLog.from_env(path, clock=lambda: 0.0)
    assert log.maybe_write(0, now=1.0)                   # the first line at once
    assert not log.maybe_write(5, now=5.0)               # not due
    assert log.maybe_write(40, now=11.0)
    with open(path) as f:
        lines = [json.loads(x) for x in f]
    assert [x["pages"] for x in lines] == [0, 40]
    assert [x["t"] for x in lines] == [1.0, 11.0]
    last = lines[-1]
    assert last["rss_anon"] > 0 and last["py_blocks"] > 0
    assert last["arenas"] >= 1 and last["py_allocated"] > 0      # pymalloc's own numbers (CPython)
    assert len(last["gc_count"]) == 3
