"""DRUM persistence: reopen after close, kill -9 at random moments, damaged files."""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from crawlerd._native import drum as native
from crawlerd.seen.drum import Drum
from crawlerd.seen.drum_files import HEADER_BYTES, DrumCorrupt, DrumError

# The child crawls a deterministic stream: the key of submission seq is KEY(seq), so the
# expected answer of every seq is known whatever the crashes did.
CHILD = r"""
import os, signal, sys, random, zlib
import crawlerd.seen.drum as drum_mod
import crawlerd.seen.drum_answers as answers_mod
import crawlerd.seen.drum_files as files_mod
from crawlerd.seen.drum import Drum

d, log, crash_at, batches, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

def KEY(seq):
    x = (seq * 0x9E3779B97F4A7C15) % 2**64
    return [3, 2**63, 2**64 - 1][x % 3] if x % 11 == 0 else (x % 700) * 0x100000001B3 % 2**64

class FaultyOs:
    # Kills this process at the crash_at-th file-system call DRUM makes (open, fsync, rename, ...).
    WATCH = {"replace", "fsync", "unlink", "ftruncate", "pwrite", "open", "write", "truncate", "pread"}
    def __init__(self, real):
        self._real, self.n = real, 0
    def __getattr__(self, name):
        f = getattr(self._real, name)
        if name not in self.WATCH:
            return f
        def wrapped(*a, **k):
            self.n += 1
            if self.n == crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return f(*a, **k)
        return wrapped

drum_mod.os = answers_mod.os = files_mod.os = FaultyOs(os)   # one count over every DRUM module
rng = random.Random(seed)
logfd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
dr = Drum(d, buckets=4, bucket_buffer_bytes=64, merge_bytes=4 * 400, cache_entries=64, max_age_s=1e9)

def drain():
    lines = []
    for r in dr.results(rng.randint(1, 40)):
        body = "%d %d %d %s" % (r.seq, r.key, r.unique, r.aux.decode())
        lines.append("%s %d\n" % (body, zlib.crc32(body.encode())))
    if lines:
        os.write(logfd, "".join(lines).encode())

for b in range(batches):
    s = dr.next_seq
    keys = [KEY(s + i) for i in range(rng.randint(1, 16))]
    dr.check_update(keys, aux=[b"%d" % k for k in keys])
    print("tick", flush=True)
    drain()
    if rng.random() < 0.05:
        dr.flush()
dr.close()
print("done", flush=True)
"""


def KEY(seq: int) -> int:
    x = (seq * 0x9E3779B97F4A7C15) % 2**64
    return [3, 2**63, 2**64 - 1][x % 3] if x % 11 == 0 else (x % 700) * 0x100000001B3 % 2**64


def _read_log(path: str) -> list[tuple[int, int, bool, bytes]]:
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path, "rb").read().decode(errors="replace").split("\n"):
        parts = line.split(" ")
        if len(parts) != 5:
            continue
        body = " ".join(parts[:4])
        if str(zlib.crc32(body.encode())) != parts[4]:
            continue                              # a line torn by the kill
        out.append((int(parts[0]), int(parts[1]), parts[2] == "1", parts[3].encode()))
    return out


def _run_crash_rounds(tmp_path, rounds: int, batches: int, seed: int) -> None:
    rng = random.Random(seed)
    d, log = str(tmp_path / "drum"), str(tmp_path / "log")
    kills = 0
    for rnd in range(rounds):
        mode = rng.choice(["fault", "fault", "parent", "none"])
        crash_at = rng.randint(1, 300) if mode == "fault" else -1
        p = subprocess.Popen([sys.executable, "-c", CHILD, d, log, str(crash_at), str(batches), str(seed + rnd)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            kill_after = rng.randint(1, batches) if mode == "parent" else None
            ticks = 0
            for line in p.stdout:
                ticks += line.startswith(b"tick")
                if kill_after is not None and ticks >= kill_after:
                    p.send_signal(signal.SIGKILL)     # the child runs on: a random moment, buffering or merging
                    break
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        err = p.stderr.read().decode()
        p.stderr.close()
        p.stdout.close()
        assert p.returncode in (0, -signal.SIGKILL), err
        kills += p.returncode == -signal.SIGKILL
    assert kills >= rounds // 3
    answers: dict[int, tuple] = {}
    logged = _read_log(log)
    with Drum(d, buckets=4, bucket_buffer_bytes=64, merge_bytes=4 * 400, cache_entries=64) as dr:
        dr.flush()
        final = [(r.seq, r.key, r.unique, r.aux) for r in dr.results(10**6)]
        end = dr.next_seq
        assert dr.pending == 0
        stored = len(dr)
    for seq, key, unique, aux in logged + final:
        if seq in answers:
            assert answers[seq] == (key, unique, aux), f"seq {seq} answered two ways"
        answers[seq] = (key, unique, aux)
    assert sorted(answers) == list(range(end)), "a submitted key was never answered"
    seen: set[int] = set()
    for seq in range(end):
        key, unique, aux = answers[seq]
        assert key == KEY(seq) and aux == b"%d" % key
        assert unique == (key not in seen), f"seq {seq}: key {key:#x} unique={unique}"
        seen.add(key)
    assert stored == len(seen)
    assert end > batches


def test_kill_9_at_random_moments_loses_nothing(tmp_path):
    _run_crash_rounds(tmp_path, rounds=14, batches=50, seed=11)


@pytest.mark.long
def test_kill_9_soak(tmp_path):
    _run_crash_rounds(tmp_path, rounds=150, batches=200, seed=12345)


def test_reopen_after_clean_close_keeps_everything(tmp_path):
    d = str(tmp_path)
    with Drum(d, buckets=3, bucket_buffer_bytes=64, merge_bytes=3 * 1024) as dr:
        dr.check_update(list(range(1, 301)), aux=[b"a%d" % i for i in range(1, 301)])
        dr.flush()
        first = dr.results(100)                    # 200 merged answers not yet handed out
        dr.check_update(list(range(250, 351)), aux=[b"b%d" % i for i in range(250, 351)])  # pending at close
    assert [r.seq for r in first] == list(range(100))
    with Drum(d, buckets=5, bucket_buffer_bytes=64, merge_bytes=5 * 1024) as dr:   # buckets may change
        assert len(dr) == 300 and dr.pending == 301
        dr.flush()
        rest = dr.results(10**6)
    assert [r.seq for r in rest] == list(range(100, 401))
    assert all(r.unique for r in rest[:200])
    assert [r.unique for r in rest[200:]] == [False] * 51 + [True] * 50
    assert rest[250].aux == b"b300"


def _populated(tmp_path, n=200, value_size=0):
    d = str(tmp_path)
    with Drum(d, buckets=2, value_size=value_size) as dr:
        dr.check_update(list(range(1, n + 1)), values=bytes(n * value_size) if value_size else None)
        dr.flush()
        dr.results(10**6)
    return d


def _key_file(d):
    return os.path.join(d, next(n for n in os.listdir(d) if n.startswith("keys.")))


def test_key_file_of_the_wrong_size_is_refused(tmp_path):
    d = _populated(tmp_path)
    path = _key_file(d)
    os.truncate(path, os.path.getsize(path) - 3)
    with pytest.raises(DrumCorrupt, match="bytes, expected"):
        Drum(d)


def test_damaged_key_file_is_detected_by_the_next_merge(tmp_path):
    d = _populated(tmp_path)
    path = _key_file(d)
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES + 8 * 50 + 2)
        f.write(b"\x7f")
    dr = Drum(d)
    try:
        dr.check_update([10**6])
        with pytest.raises(DrumCorrupt, match="checksum|sorted"):
            dr.flush()
        with pytest.raises(DrumError, match="unusable"):
            dr.check([1])
    finally:
        dr.close()


def test_unsorted_key_file_with_a_valid_checksum_is_refused(tmp_path):
    d = _populated(tmp_path, n=10)
    path = _key_file(d)
    data = bytearray(open(path, "rb").read())
    keys = list(struct.unpack_from("<10Q", data, HEADER_BYTES))
    keys[3], keys[4] = keys[4], keys[3]
    struct.pack_into("<10Q", data, HEADER_BYTES, *keys)
    h = native.hash_words(bytes(data[HEADER_BYTES:]))
    struct.pack_into("<Q", data, 24, h)
    open(path, "wb").write(data)
    man = json.loads(open(os.path.join(d, "MANIFEST")).read())
    man["hash"] = h
    open(os.path.join(d, "MANIFEST"), "w").write(json.dumps(man))
    with Drum(d) as dr:
        dr.check_update([10**6])
        with pytest.raises(DrumCorrupt, match="not strictly sorted"):
            dr.flush()


def test_torn_journal_tail_is_cut_off(tmp_path):
    d = str(tmp_path)
    with Drum(d, buckets=2) as dr:
        dr.check_update([1, 2, 3], aux=[b"x", b"y", b"z"])
        dr.check_update([4, 5], aux=[b"p", b"q"])
    journal = os.path.join(d, next(n for n in os.listdir(d) if n.startswith("journal.")))
    os.truncate(journal, os.path.getsize(journal) - 5)     # the second call never returned
    with Drum(d, buckets=2) as dr:
        assert dr.pending == 3
        dr.flush()
        assert [(r.key, r.unique, r.aux) for r in dr.results()] == [(1, True, b"x"), (2, True, b"y"),
                                                                     (3, True, b"z")]
        dr.check_update([4])
        dr.flush()
        assert [(r.seq, r.unique) for r in dr.results()] == [(3, True)]


def test_zero_filled_journal_tail_is_cut_off(tmp_path):
    d = str(tmp_path)
    with Drum(d, buckets=2) as dr:
        dr.check_update([1, 2])
    journal = os.path.join(d, next(n for n in os.listdir(d) if n.startswith("journal.")))
    with open(journal, "ab") as f:
        f.write(bytes(4096))
    with Drum(d, buckets=2) as dr:
        assert dr.pending == 2


def test_damaged_journal_block_before_the_end_is_an_error(tmp_path):
    d = str(tmp_path)
    with Drum(d, buckets=2) as dr:
        for i in range(3):
            dr.check_update([i + 1, i + 100])
    journal = os.path.join(d, next(n for n in os.listdir(d) if n.startswith("journal.")))
    with open(journal, "r+b") as f:
        f.seek(44)                                         # a key byte of the first block
        f.write(b"\xee")
    with pytest.raises(DrumCorrupt, match="bad journal block at offset 0"):
        Drum(d, buckets=2)


def test_torn_bucket_file_is_never_read_as_data(tmp_path):
    d = str(tmp_path)
    with Drum(d, buckets=2, bucket_buffer_bytes=32, merge_bytes=1 << 20) as dr:
        dr.check_update(list(range(1, 101)))
        assert dr._core.spilled_bytes(0) + dr._core.spilled_bytes(1) > 0
    for name in os.listdir(d):
        if name.startswith("bucket."):
            with open(os.path.join(d, name), "r+b") as f:   # torn and garbled spill records
                f.truncate(37)
                f.write(b"\xff" * 29)
    with Drum(d, buckets=2, bucket_buffer_bytes=32, merge_bytes=1 << 20) as dr:
        dr.flush()
        out = dr.results(1000)
        assert [(r.key, r.unique) for r in out] == [(k, True) for k in range(1, 101)]
        assert len(dr) == 100


def test_damaged_results_file_is_detected(tmp_path):
    d = str(tmp_path)
    with Drum(d, buckets=2) as dr:
        dr.check_update([1, 2, 3])
        dr.flush()
    res = os.path.join(d, next(n for n in os.listdir(d) if n.startswith("results.")))
    with open(res, "r+b") as f:
        f.seek(HEADER_BYTES + 1)
        f.write(b"\x05")
    with Drum(d, buckets=2) as dr, pytest.raises(DrumCorrupt, match="checksum"):
        dr.results()


def test_unreadable_manifest_is_an_error(tmp_path):
    d = _populated(tmp_path)
    open(os.path.join(d, "MANIFEST"), "wb").write(b"{not json")
    with pytest.raises(DrumCorrupt, match="manifest"):
        Drum(d)


def test_leftovers_of_an_uncommitted_merge_are_removed(tmp_path):
    d = _populated(tmp_path, n=20)
    gen = int(_key_file(d).rsplit(".", 1)[1])
    for name in (f"keys.{gen + 1:012d}.tmp", f"keys.{gen + 1:012d}", "results.000000099999", "MANIFEST.tmp"):
        open(os.path.join(d, name), "wb").write(b"junk")
    with Drum(d) as dr:
        assert len(dr) == 20
        dr.check_update(np.array([5, 25], dtype=np.uint64))
        dr.flush()
        assert [r.unique for r in dr.results()] == [False, True]
    assert not any(n.endswith(".tmp") or n == "results.000000099999" for n in os.listdir(d))


def test_unacknowledged_results_are_delivered_again_after_reopen(tmp_path):
    d = str(tmp_path)
    with Drum(d, buckets=2, auto_ack=False) as dr:
        dr.check_update([1, 2, 3, 4])
        dr.flush()
        assert [r.key for r in dr.results(2)] == [1, 2]
        dr.ack()                                   # the consumer committed 1 and 2
        assert [r.key for r in dr.results(2)] == [3, 4]
    with Drum(d, buckets=2, auto_ack=False) as dr:   # 3 and 4 were never acknowledged
        assert dr.pending == 2
        again = dr.results()
        assert [(r.key, r.seq, r.unique) for r in again] == [(3, 2, True), (4, 3, True)]
        dr.ack()
    with Drum(d, buckets=2) as dr:
        assert dr.pending == 0 and dr.results() == []
        assert not any(n.startswith(("journal.", "results.")) and os.path.getsize(os.path.join(d, n))
                       for n in os.listdir(d))
