"""IPSlots: native and reference run the same sequences, agree byte for byte, and exclude across processes."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from crawlerd._native import ipslots, ipslots_ref
from crawlerd._native.ipslots import IPSlots
from crawlerd._native.ipslots_ref import RefIPSlots

IMPLS = [(IPSlots, ipslots.create), (RefIPSlots, ipslots_ref.create)]
IDS = ["native", "ref"]


@pytest.fixture(params=IMPLS, ids=IDS)
def impl(request):
    return request.param


def table(tmp_path, impl, *, shards=3, cells=1, entries=64, name="slots"):
    cls, create = impl
    path = str(tmp_path / name)
    create(path, shards, cells, entries)
    return path, cls


class TestIPSlots:
    def test_one_request_per_ip_across_shards(self, tmp_path, impl):
        path, cls = table(tmp_path, impl)
        a, b = cls(path), cls(path)
        a.attach(0)
        b.attach(1)
        assert a.try_acquire(7, 10.0, 0.0) == 0.0
        assert b.try_acquire(7, 10.0, 0.0) == 10.0          # full: try again later
        assert b.try_acquire(8, 10.0, 0.0) == 0.0           # another entry
        assert a.held() == 2 and a.held(0) == 1 and a.held(1) == 1
        assert a.release(7, 11.0, 0.0)
        assert b.try_acquire(7, 11.0, 0.0) == 0.0
        assert not a.release(7, 12.0, 0.0)                  # a holds nothing there any more
        a.close()
        b.close()

    def test_ip_delay_between_starts_and_after_the_end(self, tmp_path, impl):
        path, cls = table(tmp_path, impl, cells=2)
        a, b = cls(path), cls(path)
        a.attach(0)
        b.attach(1)
        assert a.try_acquire(5, 100.0, 2.0) == 0.0
        assert b.try_acquire(5, 101.0, 2.0) == 102.0        # a cell is free, but the IP's gap is not over
        assert b.try_acquire(5, 102.0, 2.0) == 0.0          # two in flight (cells=2), starts 2 s apart
        assert a.release(5, 103.0, 2.0)
        assert a.due(5) == 105.0                            # the end pushes the gap too
        assert a.try_acquire(5, 104.0, 2.0) == 105.0

    def test_colliding_ips_only_serialise_more(self, tmp_path, impl):
        path, cls = table(tmp_path, impl, entries=4)
        a = cls(path)
        a.attach(0)
        assert a.try_acquire(1, 10.0, 0.0) == 0.0
        assert a.try_acquire(1 + 4, 10.0, 0.0) == 10.0      # same entry: waits, never doubles up

    def test_attach_frees_the_cells_of_a_dead_generation(self, tmp_path, impl):
        path, cls = table(tmp_path, impl)
        old = cls(path)
        g1 = old.attach(2)
        assert old.try_acquire(3, 10.0, 0.0) == 0.0 and old.try_acquire(4, 10.0, 0.0) == 0.0
        other = cls(path)
        other.attach(0)
        assert other.try_acquire(9, 10.0, 0.0) == 0.0
        new = cls(path)                                     # shard 2 restarted: its old process is gone
        assert new.attach(2) == g1 + 1
        assert new.held(2) == 0 and new.held(0) == 1        # another shard's cells are kept
        assert new.try_acquire(3, 11.0, 0.0) == 0.0
        assert other.reclaim(2) == 1 and other.held() == 1  # the supervisor frees a dead shard's cells

    def test_a_freed_cell_ends_its_request_at_the_reclaim(self, tmp_path, impl):
        path, cls = table(tmp_path, impl)
        dead, other = cls(path), cls(path)
        dead.attach(1)
        other.attach(0)
        assert dead.try_acquire(3, 10.0, 1.0) == 0.0        # due 11.0
        assert other.reclaim(1, 20.0, 1.0) == 1             # its process died; noticed at 20.0
        assert other.try_acquire(3, 20.5, 1.0) == 21.0      # the gap runs from the cut-off request's end
        assert other.try_acquire(3, 21.0, 1.0) == 0.0
        again = cls(path)
        assert again.attach(0, 30.0, 1.0) and other.held() == 0 and again.due(3) == 31.0

    def test_errors(self, tmp_path, impl):
        path, cls = table(tmp_path, impl)
        s = cls(path)
        with pytest.raises(ValueError):
            s.try_acquire(1, 1.0, 0.0)                      # not attached
        with pytest.raises(ValueError):
            s.attach(3)
        s.attach(0)
        with pytest.raises(ValueError):
            s.try_acquire(1, 0.0, 0.0)
        s.close()
        with pytest.raises(ValueError):
            s.try_acquire(1, 1.0, 0.0)
        with pytest.raises(ValueError):
            impl[1](str(tmp_path / "bad"), 1, 1, 3)         # entries not a power of two
        (tmp_path / "junk").write_bytes(b"x" * 200)
        with pytest.raises(ValueError):
            cls(str(tmp_path / "junk"))


def test_native_and_reference_agree_on_random_sequences(tmp_path):
    rng = random.Random(5)
    for round_ in range(3):
        paths = []
        for impl, name in zip(IMPLS, IDS, strict=True):
            p = str(tmp_path / f"{name}{round_}")
            impl[1](p, 3, 2, 16)
            paths.append(p)
        sides = [[cls(p) for _ in range(3)] for (cls, _), p in zip(IMPLS, paths, strict=True)]
        for side in sides:
            for i, s in enumerate(side):
                s.attach(i)
        now = 1.0
        for _ in range(3000):
            now += rng.random() * 0.3
            shard, key = rng.randrange(3), rng.randrange(40)
            op = rng.random()
            delay = rng.choice((0.0, 0.5))
            if op < 0.5:
                res = [side[shard].try_acquire(key, now, delay) for side in sides]
            elif op < 0.95:
                res = [side[shard].release(key, now, delay) for side in sides]
            elif op < 0.98:
                res = [side[shard].attach(shard, now, delay) for side in sides]
            else:
                res = [side[0].reclaim(shard, now, delay) for side in sides]
            assert res[0] == res[1], (op, shard, key, res)
        for side in sides:
            for s in side:
                s.close()
        with open(paths[0], "rb") as f0, open(paths[1], "rb") as f1:
            assert f0.read() == f1.read()


_HAMMER = textwrap.dedent("""
    import sys, time
    from crawlerd._native.ipslots import IPSlots
    from crawlerd._native.ipslots_ref import RefIPSlots
    cls = IPSlots if sys.argv[1] == "native" else RefIPSlots
    s = cls(sys.argv[2]); s.attach(int(sys.argv[3]))
    out = []
    done = 0
    deadline = time.monotonic() + 20
    while done < int(sys.argv[4]) and time.monotonic() < deadline:
        key = done % 3
        if s.try_acquire(key, time.monotonic(), 0.0) == 0.0:
            t0 = time.monotonic_ns()
            for _ in range(200):
                pass
            t1 = time.monotonic_ns()
            assert s.release(key, time.monotonic(), 0.0)
            out.append(f"{key} {t0} {t1}")
            done += 1
    print("\\n".join(out))
""")


@pytest.mark.parametrize("name", IDS)
def test_processes_never_overlap_on_one_ip(tmp_path, name):
    path = str(tmp_path / "slots")
    ipslots.create(path, 4, 1, 64)
    procs = [subprocess.Popen([sys.executable, "-c", _HAMMER, name, path, str(i), "400"], stdout=subprocess.PIPE,
                              text=True) for i in range(4)]
    spans: dict[int, list[tuple[int, int]]] = {}
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        lines = out.split()
        assert len(lines) == 3 * 400
        for k, t0, t1 in zip(lines[::3], lines[1::3], lines[2::3], strict=True):
            spans.setdefault(int(k), []).append((int(t0), int(t1)))
    for k, lst in spans.items():
        lst.sort()
        for (_a0, a1), (b0, _b1) in zip(lst, lst[1:], strict=False):
            assert a1 < b0, f"key {k}: two holders at once"


def test_kill_9_of_a_holder_is_reclaimed_by_its_restart(tmp_path):
    path = str(tmp_path / "slots")
    ipslots.create(path, 2, 1, 64)
    code = ("import sys, time; from crawlerd._native.ipslots import IPSlots; s = IPSlots(sys.argv[1]); "
            "s.attach(1); assert s.try_acquire(11, time.monotonic(), 0.0) == 0.0; print('held', flush=True); "
            "time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    s = IPSlots(path)
    s.attach(0)
    assert s.try_acquire(11, time.monotonic(), 0.0) > 0        # the dead process still holds it
    again = IPSlots(path)
    again.attach(1)                                             # shard 1 restarted
    assert s.try_acquire(11, time.monotonic(), 0.0) == 0.0
