"""EventLog: JSON lines with schema_version, size rotation, torn-line recovery."""

from __future__ import annotations

import json
import os

import pytest

from crawlerd.outcome import Outcome
from crawlerd.store.events import SCHEMA_VERSION, EventLog, read_events
from tests.store.helpers import Clock


def files(directory, suffix=".jsonl"):
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(suffix))


def test_lines_carry_schema_version(tmp_path):
    log = EventLog(str(tmp_path), clock=Clock())
    log.write({"url": "http://example.com/", "status": 200, "outcome": Outcome.OK,
               "warc": {"file": "a.warc.gz", "offset": 10, "length": 99}})
    log.write({"schema_version": 7, "url": "http://example.com/x"})
    log.close()
    [path] = files(tmp_path)
    events = list(read_events(path))
    assert events[0] == {"schema_version": SCHEMA_VERSION, "url": "http://example.com/", "status": 200,
                         "outcome": "ok", "warc": {"file": "a.warc.gz", "offset": 10, "length": 99}}
    assert events[1]["schema_version"] == 7
    with open(path, "rb") as f:
        assert f.read().count(b"\n") == 2


def test_rotation_by_size(tmp_path):
    log = EventLog(str(tmp_path), max_bytes=1000, clock=Clock())
    for i in range(100):
        log.write({"url": f"http://example.com/{i}", "pad": "x" * 50})
    log.close()
    paths = files(tmp_path)
    assert len(paths) > 5
    for p in paths:
        size = os.path.getsize(p)
        assert size >= 1000 or p == paths[-1]
        with open(p, "rb") as f:
            last_line = f.read().splitlines(keepends=True)[-1]
        assert size - len(last_line) < 1000          # only the last line crosses the limit
    urls = [e["url"] for p in paths for e in read_events(p)]
    assert urls == [f"http://example.com/{i}" for i in range(100)]
    assert not files(tmp_path, ".open")


def test_flush_and_buffering(tmp_path):
    log = EventLog(str(tmp_path), buffer_bytes=1 << 20, clock=Clock())
    log.write({"a": 1})
    assert os.path.getsize(log.current_path) == 0
    log.flush()
    assert os.path.getsize(log.current_path) > 0
    log.close()
    assert log.current_path is None


def test_torn_last_line_cut_on_next_start(tmp_path):
    log = EventLog(str(tmp_path), clock=Clock())
    for i in range(3):
        log.write({"i": i})
    log.flush()
    torn = log.current_path
    with open(torn, "ab") as f:
        f.write(b'{"i": 3, "url": "http://exa')       # kill -9 mid-line
    assert [e["i"] for e in read_events(torn)] == [0, 1, 2]
    log2 = EventLog(str(tmp_path), clock=Clock())
    assert log2.recovered[0].startswith("truncated ")
    final = torn[:-len(".open")]
    assert [json.loads(line)["i"] for line in open(final)] == [0, 1, 2]
    log2.write({"i": 4})
    log2.close()
    assert len(files(tmp_path)) == 2
    assert os.path.basename(files(tmp_path)[-1]).split("-")[2] == "00001.jsonl"


def test_empty_open_file_removed(tmp_path):
    (tmp_path / "events-20240101000000000000-00000.jsonl.open").write_bytes(b'{"torn')
    (tmp_path / "other-20240101000000000000-00000.jsonl.open").write_bytes(b'{"torn')
    log = EventLog(str(tmp_path))
    assert log.recovered[-1] == "removed empty events-20240101000000000000-00000.jsonl.open"
    assert not (tmp_path / "events-20240101000000000000-00000.jsonl.open").exists()
    assert os.path.exists(tmp_path / "other-20240101000000000000-00000.jsonl.open")   # another log's file


def test_bad_name_refused(tmp_path):
    with pytest.raises(ValueError):
        EventLog(str(tmp_path), name="a/b")
