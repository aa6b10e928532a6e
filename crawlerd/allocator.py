"""glibc malloc settings of a long-lived crawler process, its periodic trim, and its heap numbers.

Why a trim on a timer: after ``free`` glibc keeps freed chunks inside the heap for reuse and gives
back only the top of the heap past ``M_TRIM_THRESHOLD``. ``malloc_trim(0)`` also returns the
whole free pages inside it (MADV_DONTNEED), but the allocations that follow split those free
chunks again and fault fresh pages in. So between two trims a process's private memory is what
is live plus, at most, what it allocated and freed since the last trim (its *churn*: bodies,
answer batches, parse buffers), bounded by the free space inside the heap's extent. A burst of
work raises the extent (its high-water mark) and then leaves more free room for the churn to
spread over: private memory follows churn per trim interval, i.e. the crawl's rate times the
interval, not what is live. A shorter interval bounds that term (`malloc.trim_interval_s`);
each trim's duration is measured and shown in `crawlerd stats` (``malloc``).

Not glibc (musl, another libc): every call here is a no-op and the stats are empty.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import sys
import tempfile
import time

# mallopt(3) parameters (glibc malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33+): every field a size_t."""
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None, None      # not glibc: no tuning, no trim
    try:
        info = libc.mallinfo2
        info.restype = _MallInfo2
        info.argtypes = []
    except AttributeError:
        info = None             # glibc before 2.33: no heap numbers
    return libc, info


_LIBC, _MALLINFO2 = _libc()
MMAP_THRESHOLD_BYTES = 256 << 10   # default of malloc.mmap_threshold_bytes
ARENA_MAX = 4                      # default of malloc.arena_max
TRIM_INTERVAL_S = 10.0             # default of malloc.trim_interval_s


def tune_malloc(mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES, arena_max: int = ARENA_MAX) -> None:
    """Allocations of ``mmap_threshold_bytes`` and more get their own mapping, returned to the
    kernel when freed (glibc otherwise raises the threshold after the first large free, and a
    crawl's large, short-lived buffers then fragment the heap for good); the heap top is trimmed
    past twice that; at most ``arena_max`` malloc arenas for the process's threads (each thread
    otherwise may get its own 64 MiB arena); Python's arenas mapped resident
    (:func:`populate_python_arenas`). Call once, at process start, before the stores open."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, 2 * mmap_threshold_bytes)
        _LIBC.mallopt(_M_ARENA_MAX, arena_max)
    populate_python_arenas()


def populate_python_arenas() -> bool:
    """Python's 1 MiB object arenas resident whole from the moment each is mapped
    (``_native/arenas.pyx``): pymalloc carves an arena into pools as objects need them and returns
    it only when empty, so left alone the pools of the arenas a process holds come in over hours of
    churn and read as private memory growing with the crawl. The package's import installs it
    already (crawlerd/__init__.py); this call is idempotent. False where the kernel is missing."""
    try:
        from crawlerd._native.arenas import populate_arenas
    except ImportError:
        return False
    return populate_arenas()


def malloc_trim() -> None:
    """Give free C-heap pages back to the kernel (glibc malloc_trim(0): top and interior pages), so
    a process's private memory follows what is live, not its fragmentation high-water mark."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def heap_stats() -> dict[str, int]:
    """The C heap of this process, bytes (glibc ``mallinfo2``, every arena): ``heap`` obtained by
    sbrk and the thread arenas' heaps (their extent, resident or not), ``mmap`` in blocks mapped
    alone, ``in_use`` handed out from the heaps, ``free`` in free chunks inside the heaps, ``top``
    of it at the heaps' tops. Empty without glibc 2.33+."""
    if _MALLINFO2 is None:
        return {}
    mi = _MALLINFO2()
    return {"heap": mi.arena, "mmap": mi.hblkhd, "in_use": mi.uordblks, "free": mi.fordblks, "top": mi.keepcost}


class Trimmer:
    """Calls :func:`malloc_trim` at most every ``interval_s`` (0: never), timing each call.

    Invariant: ``count`` trims ran, the longest took ``max_ms`` and all together ``total_ms``;
    ``anon_after`` is the private memory read right after the last one (what the process keeps,
    without the churn a trim returns: the soak fits it). A call trims when ``interval_s`` passed
    since the last trim, or none ran yet."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S, clock=time.monotonic) -> None:
        self.interval_s = float(interval_s)
        self.clock = clock
        self.last = None
        self.count = 0
        self.max_ms = 0.0
        self.total_ms = 0.0
        self.anon_after = None      # RssAnon right after the last trim: what the process keeps, bytes

    def maybe_trim(self, now: float | None = None) -> bool:
        """Trim if the interval passed; True if it trimmed."""
        if self.interval_s <= 0:
            return False
        now = self.clock() if now is None else now
        if self.last is not None and now - self.last < self.interval_s:
            return False
        self.last = now
        t0 = time.perf_counter()
        malloc_trim()
        ms = (time.perf_counter() - t0) * 1e3
        self.count += 1
        self.total_ms += ms
        self.max_ms = max(self.max_ms, ms)
        self.anon_after = rss_anon()
        return True

    def stats(self) -> dict:
        """Heap numbers with the trims' count and cost (`crawlerd stats`: ``malloc``), and
        ``py_blocks``: the memory blocks Python's allocator holds (growth there is Python objects;
        growth of the C heap without it is C allocations: LMDB, curl, the native kernels)."""
        out = {**heap_stats(), "trims": self.count, "trim_ms_max": round(self.max_ms, 3),
               "trim_ms_total": round(self.total_ms, 3), "trim_interval_s": self.interval_s,
               "anon_after_trim": self.anon_after, "py_blocks": sys.getallocatedblocks()}
        if os.environ.get(DIAG_ENV):
            out["diag"] = allocator_diag()
        return out


# --- a debug switch: where the private memory sits, allocator by allocator -----------------------

DIAG_ENV = "CRAWLERD_MEMDIAG"   # set (non-empty): `stats` malloc.diag, for diagnosis only (walks every pool)


def _dump_to_text(call) -> str:
    """What ``call(FILE*)`` writes to a C stream, read back (through a temp file: no stdio in ctypes)."""
    if _LIBC is None:
        return ""
    fd, path = tempfile.mkstemp(prefix="crawlerd-memdiag-")
    try:
        _LIBC.fdopen.restype = ctypes.c_void_p
        _LIBC.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
        _LIBC.fclose.argtypes = [ctypes.c_void_p]
        fp = _LIBC.fdopen(fd, b"w")
        if not fp:
            os.close(fd)
            return ""
        call(fp)
        _LIBC.fclose(fp)
        with open(path) as f:
            return f.read()
    finally:
        os.unlink(path)


def pymalloc_stats() -> dict[str, int]:
    """Python's small-object allocator (CPython's ``_PyObject_DebugMallocStats``): ``arenas`` of
    1 MiB mapped now and their high-water mark, bytes in blocks handed out, free in used pools
    (``available``), and the total the arenas take. Arenas are returned only when wholly empty,
    so ``arenas`` can stay high while ``allocated`` falls: that is fragmentation, not a leak."""
    try:
        fn = ctypes.pythonapi._PyObject_DebugMallocStats  # noqa: SLF001 (a C API function of CPython)
    except AttributeError:
        return {}
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_int
    text = _dump_to_text(fn)
    keys = {"arenas allocated current": "arenas", "arenas highwater mark": "arenas_max",
            "bytes in allocated blocks": "allocated", "bytes in available blocks": "available",
            "bytes lost to quantization": "quantization"}
    out = {}
    for m in re.finditer(r"^# ([a-z ]+?)\s*=\s*([0-9,]+)$", text, re.M):
        if m.group(1) in keys:
            out[keys[m.group(1)]] = int(m.group(2).replace(",", ""))
    return out


def arena_stats() -> list[dict[str, int]]:
    """glibc's arenas one by one (``malloc_info``): each arena's extent (``system``), its free
    chunks (``free``: fast and other bins) and, last, the blocks mapped alone (``mmap``)."""
    if _LIBC is None or not hasattr(_LIBC, "malloc_info"):
        return []
    _LIBC.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    text = _dump_to_text(lambda fp: _LIBC.malloc_info(0, fp))
    out = []
    for nr, body in re.findall(r'<heap nr="(\d+)">(.*?)</heap>', text, re.S):
        free = sum(int(x) for x in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>', body))
        system = re.search(r'<system type="current" size="(\d+)"/>', body)
        out.append({"arena": int(nr), "system": int(system.group(1)) if system else 0, "free": free})
    tail = text.rsplit("</heap>", 1)[-1]
    mm = re.search(r'<total type="mmap" count="(\d+)" size="(\d+)"/>', tail)
    if mm:
        out.append({"mmap_count": int(mm.group(1)), "mmap": int(mm.group(2))})
    return out


_SPIKE = {"max": 0}


def big_containers(min_len: int = 2000, top: int = 10) -> list:
    """The largest live containers (lists, dicts, sets, deques; gc-tracked or held by one that is):
    type, length, one item's repr, the key it sits under in its parent dict and that dict's owner's
    type (diagnosis of a transient peak of Python objects; walks every object twice)."""
    import gc
    from collections import deque
    kinds = (list, dict, set, deque, bytearray)
    objs = gc.get_objects()
    cand: dict[int, tuple] = {}
    for o in objs:
        if isinstance(o, kinds) and len(o) >= min_len:
            cand.setdefault(id(o), (o, None))
        for r in gc.get_referents(o):
            if isinstance(r, kinds) and len(r) >= min_len:
                prev = cand.get(id(r))
                if prev is None or prev[1] is None:
                    cand[id(r)] = (r, o)
    best = sorted(cand.values(), key=lambda x: -len(x[0]))[:top]
    parents = {id(p): None for _, p in best if isinstance(p, dict)}
    for o in objs:
        if isinstance(o, dict):
            continue
        for r in gc.get_referents(o):
            if id(r) in parents and parents[id(r)] is None:
                parents[id(r)] = type(o).__name__
    out = []
    for o, p in best:
        try:
            item = next(iter(o.items())) if isinstance(o, dict) else next(iter(o))
        except (StopIteration, RuntimeError, TypeError):
            item = None
        key = ""
        if isinstance(p, dict):
            key = next((str(k) for k, v in p.items() if v is o), "")
        elif p is not None:
            try:
                key = next((str(k) for k, v in vars(p).items() if v is o), "")
            except TypeError:
                key = ""
        owner = parents.get(id(p)) if isinstance(p, dict) else (type(p).__name__ if p is not None else "")
        out.append([type(o).__name__, len(o), repr(item)[:80], key, owner])
    del objs
    return out


_ENVS: list = []       # (path, weakref to an lmdb.Environment) opened since the switch was read


def _watch_lmdb() -> None:
    """Remember every LMDB environment this process opens (the diagnosis counts their page buffers)."""
    import weakref

    import lmdb
    real = lmdb.open

    def opened(path, *a, **kw):
        env = real(path, *a, **kw)
        _ENVS.append((str(path), weakref.ref(env)))
        return env
    lmdb.open = opened


_MDB_ENV_OFF, _ME_PSIZE_OFF, _ME_DPAGES_OFF = 64, 16, 192   # py-lmdb 1.x-3.x EnvObject.env; LMDB 0.9 MDB_env


def lmdb_page_buffers() -> dict[str, int]:
    """Each open LMDB environment's free page buffers (MDB_env.me_dpages, walked through
    /proc/self/mem so a stale pointer reads as nothing): what its largest write transaction left."""
    out: dict[str, int] = {}
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:
        return out

    def q(addr: int) -> int:
        try:
            b = os.pread(fd, 8, addr)
        except OSError:
            return 0
        return int.from_bytes(b, "little") if len(b) == 8 else 0
    try:
        for path, ref in _ENVS:
            env = ref()
            if env is None:
                continue
            p = q(id(env) + _MDB_ENV_OFF)
            if not p or q(p + _ME_PSIZE_OFF) & 0xFFFFFFFF != 4096:
                continue
            n, page = 0, q(p + _ME_DPAGES_OFF)
            while page and n < 1 << 22:
                n += 1
                page = q(page)
            key = path.rstrip("/").rsplit("/", 2)
            out["/".join(key[-2:])] = out.get("/".join(key[-2:]), 0) + n
    finally:
        os.close(fd)
    return out


_THREAD_HEAPS: dict[str, str] = {}     # thread name -> the malloc heap its allocations come from
_HEAP_MAX = 64 << 20                   # a thread arena's heaps are 64 MiB-aligned (glibc, 64-bit)


def _thread_heap() -> str:
    """Where this thread's ``malloc`` takes memory from: ``[heap]`` (the brk heap, glibc's main
    arena) or the 64 MiB-aligned base of a thread arena's heap, hex (the soak's block scan names
    the same bases); "" without glibc."""
    if _LIBC is None:
        return ""
    _LIBC.malloc.restype = ctypes.c_void_p
    _LIBC.malloc.argtypes = [ctypes.c_size_t]
    _LIBC.free.argtypes = [ctypes.c_void_p]
    _LIBC.sbrk.restype = ctypes.c_void_p
    _LIBC.sbrk.argtypes = [ctypes.c_ssize_t]
    p = _LIBC.malloc(64)
    if not p:
        return ""
    _LIBC.free(p)
    return "[heap]" if p < (_LIBC.sbrk(0) or 0) else hex(p & ~(_HEAP_MAX - 1))


def _watch_threads() -> None:
    """Record each new thread's malloc heap at its first Python call (a profile hook that removes
    itself), so the diagnosis can say which thread's arena grows."""
    import threading

    def probe(frame, event, arg):
        sys.setprofile(None)
        _THREAD_HEAPS[threading.current_thread().name] = _thread_heap()
    threading.setprofile(probe)
    _THREAD_HEAPS[threading.current_thread().name] = _thread_heap()


if os.environ.get(DIAG_ENV):
    _watch_lmdb()
    _watch_threads()


def allocator_diag() -> dict:
    """Both allocators' numbers for `stats` (``CRAWLERD_MEMDIAG``): pymalloc's arenas, glibc's arenas
    one by one, each LMDB environment's page buffers, each thread's malloc heap; with
    ``CRAWLERD_MEMDIAG=2`` also, whenever Python's allocated blocks pass their last peak by
    20,000, the largest containers then
    (:func:`big_containers`: a walk of every object, ~0.5 s on the loop)."""
    out = {"pymalloc": pymalloc_stats(), "arenas": arena_stats(), "lmdb_buffers": lmdb_page_buffers(),
           "thread_heaps": dict(_THREAD_HEAPS)}
    blocks = sys.getallocatedblocks()
    if os.environ.get(DIAG_ENV) == "2" and blocks > _SPIKE["max"] + 20000:
        _SPIKE["max"] = blocks
        out["spike"] = big_containers()
    return out


def rss_anon() -> int | None:
    """This process's private resident memory (RssAnon of /proc/self/status), bytes; None off Linux."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
