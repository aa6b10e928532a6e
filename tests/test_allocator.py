"""The allocator's trim timer and heap numbers (crawlerd/allocator.py), on this process's glibc."""

import ctypes
import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

from crawlerd import allocator
from crawlerd.allocator import Trimmer, heap_stats


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_trims_at_most_once_per_interval():
    clock = Clock()
    t = Trimmer(2.0, clock=clock)
    assert t.maybe_trim()               # the first call trims
    clock.t += 1.9
    assert not t.maybe_trim()
    clock.t += 0.1
    assert t.maybe_trim()
    assert t.count == 2
    st = t.stats()
    assert st["trims"] == 2 and st["trim_interval_s"] == 2.0
    assert st["trim_ms_max"] >= 0 and st["trim_ms_total"] >= st["trim_ms_max"]
    assert st["anon_after_trim"] is None or st["anon_after_trim"] > 0     # None only off Linux
    assert st["py_blocks"] > 0          # Python's live allocations: told apart from the C heap's


def test_interval_zero_never_trims():
    t = Trimmer(0.0, clock=Clock())
    assert not any(t.maybe_trim() for _ in range(5))
    assert t.count == 0


_glibc = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else None
needs_glibc = pytest.mark.skipif(not (_glibc or "").startswith("glibc") or not heap_stats(),
                                 reason="needs glibc 2.33+ (mallinfo2)")

# In a fresh interpreter (a heap nobody else touched): 64 MiB in 32 KiB blocks (below the mmap
# threshold, so from the heap), every 16th kept alive so the heap's top cannot shrink, the rest
# freed. The free chunks stay resident until a trim; one trim gives their whole pages back.
_PROBE = r"""
import json
from crawlerd.allocator import Trimmer, heap_stats, tune_malloc
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
tune_malloc()
blocks = [bytes(32 << 10) for _ in range(2048)]
kept = blocks[::16]
before = heap_stats()
del blocks
freed = anon(), heap_stats()
Trimmer(1.0).maybe_trim()
print(json.dumps({"before": before, "freed_anon": freed[0], "freed": freed[1], "trimmed_anon": anon(),
                  "trimmed": heap_stats(), "kept": len(kept)}))
"""


@needs_glibc
def test_trim_gives_back_the_free_pages_inside_the_heap():
    import json
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONMALLOC="pymalloc"))
    r = json.loads(out.stdout)
    mib = 1 << 20
    assert r["before"]["in_use"] >= 60 * mib                        # the blocks came from the heap
    assert r["freed"]["free"] >= 50 * mib                           # freed, but inside the heap's extent
    assert r["freed"]["heap"] >= 60 * mib                           # the extent did not shrink: 1/16 kept
    assert r["freed_anon"] - r["trimmed_anon"] >= 40 * mib, r       # the trim returned the free pages
    assert r["trimmed"]["in_use"] < 8 * mib                         # 128 blocks of 32 KiB stay live


_DIAG_PROBE = """
import json
from crawlerd.allocator import allocator_diag
first = allocator_diag()
objs = [bytes(200) for _ in range(200_000)]        # ~48 MiB of small objects: pymalloc arenas
big = bytearray(8 << 20)                            # one block mapped alone (mmap threshold)
print(json.dumps({"first": first, "then": allocator_diag(), "n": len(objs) + len(big)}))
"""


@needs_glibc
def test_the_diagnosis_counts_pymalloc_arenas_and_glibc_mapped_blocks():
    import json
    out = subprocess.run([sys.executable, "-c", _DIAG_PROBE], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONMALLOC="pymalloc"))
    r = json.loads(out.stdout)
    mib = 1 << 20
    a, b = r["first"], r["then"]
    assert b["pymalloc"]["allocated"] - a["pymalloc"]["allocated"] >= 40 * mib
    assert b["pymalloc"]["arenas"] - a["pymalloc"]["arenas"] >= 40           # 1 MiB arenas
    assert b["pymalloc"]["arenas_max"] >= b["pymalloc"]["arenas"]
    assert b["arenas"][0]["arena"] == 0 and b["arenas"][0]["system"] > 0     # the main arena
    assert b["arenas"][-1]["mmap"] - a["arenas"][-1]["mmap"] >= 8 * mib      # the bytearray


def test_stats_carry_the_diagnosis_only_when_asked(monkeypatch):
    from crawlerd.allocator import DIAG_ENV
    monkeypatch.delenv(DIAG_ENV, raising=False)
    assert "diag" not in Trimmer(0).stats()
    monkeypatch.setenv(DIAG_ENV, "1")
    assert set(Trimmer(0).stats()["diag"]) == {"pymalloc", "arenas", "lmdb_buffers", "thread_heaps"}


@pytest.mark.skipif(allocator._LIBC is None, reason="needs glibc")
def test_each_thread_is_named_with_the_malloc_heap_it_allocates_from():
    # the diagnosis says which thread's arena grows: the main thread takes from the brk heap, a
    # thread started after the switch from a 64 MiB-aligned thread arena's heap (a fresh process:
    # its first thread gets an arena of its own)
    code = textwrap.dedent("""
        import json, threading
        from crawlerd import allocator
        allocator._watch_threads()
        t = threading.Thread(target=lambda: bytearray(10), name="probe-thread")
        t.start()
        t.join()
        print(json.dumps(allocator._THREAD_HEAPS))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != allocator.DIAG_ENV})
    heaps = json.loads(out.stdout)
    assert heaps["MainThread"] == "[heap]"
    assert heaps["probe-thread"].startswith("0x") and int(heaps["probe-thread"], 16) % (64 << 20) == 0


class _ArenaAllocator(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p),
                ("alloc", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)),
                ("free", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t))]


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="needs Linux /proc")
def test_python_arenas_are_mapped_resident_whole():
    # pymalloc carves an arena into pools as objects need them: left alone an arena's pages come
    # in over hours of churn. With the allocator installed (at process start: tune_malloc) each
    # arena is resident whole from its mapping, and objects still come and go through it
    assert allocator.populate_python_arenas()
    got = _ArenaAllocator()
    ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(got))
    size = 1 << 20
    p = got.alloc(got.ctx, size)
    assert p
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(p // 4096 * 8)
            raw = f.read(size // 4096 * 8)
        present = sum(int.from_bytes(raw[i:i + 8], "little") >> 63 for i in range(0, len(raw), 8))
        assert present == size // 4096
    finally:
        got.free(got.ctx, p, size)
    objs = [(i,) for i in range(300_000)]       # new arenas through the installed allocator
    assert sum(t[0] for t in objs) == 300_000 * 299_999 // 2


def test_the_largest_containers_are_named_by_their_owner_and_attribute():
    # CRAWLERD_MEMDIAG=2: a transient peak of Python objects is told by what holds them
    class Holder:
        def __init__(self):
            self.batch = [(i,) for i in range(50_000)]
            self.table = {i: str(i) for i in range(30_000)}     # untracked by gc: found through its owner

    h = Holder()
    # other tests' stores may still be alive or uncollected here, each with its Bloom filters
    # (bytearrays of 512 KiB - 2 MiB, larger than these): the test is about the naming, not the rank
    gc.collect()
    rows = {(r[0], r[1]): r for r in allocator.big_containers(min_len=20_000, top=100)}
    assert rows[("list", 50_000)][3:] == ["batch", "Holder"]
    assert rows[("dict", 30_000)][3:] == ["table", "Holder"]
    del h


def test_importing_crawlerd_installs_the_arena_allocator_before_anything_else():
    # the arenas the imports fill (numpy, lmdb, curl, the crawler's modules) must be mapped by it
    # too, or their pools come in over the crawl: installed by the package's own import
    code = (
        "import ctypes\n"
        "class A(ctypes.Structure):\n"
        "    _fields_ = [('ctx', ctypes.c_void_p), ('alloc', ctypes.c_void_p), ('free', ctypes.c_void_p)]\n"
        "def current():\n"
        "    a = A(); ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(a)); return a.alloc\n"
        "before = current()\n"
        "import crawlerd\n"
        "after = current()\n"
        "from crawlerd.allocator import populate_python_arenas\n"
        "populate_python_arenas()\n"
        "print(before != after, after == current())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True"]          # replaced at import; tune_malloc's call changes nothing
