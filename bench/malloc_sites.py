"""Which C call sites hold heap bytes: build the `malloc_sites.c` preload and read its dumps.

A diagnosis tool, off by default (nothing in crawlerd loads it). `soak_bench.py --malloc-sites DIR`
builds the library with gcc and preloads it into the crawl process only; from
``--malloc-sites-start`` seconds on it records every malloc with its call chain and, every
``--malloc-sites-every`` seconds and at exit, writes what is still live to ``DIR/sites.<pid>.<t>.txt``
(the format is in `malloc_sites.c`). This script ranks the chains: by live bytes at the last dump
and by what they gained between two dumps, each with its live KiB at every dump (a cache that fills
flattens; a leak keeps rising), resolved to function and source line with ``addr2line``::

    python bench/malloc_sites.py DIR [--top 25] [--from SECONDS] [--depth 6]
    LD_PRELOAD=$(python bench/malloc_sites.py --build /tmp/ms) MALLOC_SITES_OUT=/tmp/ms/sites program

A chain is named by its first frame that is not an allocator's own (glibc, this library, CPython's
``PyMem_*``/``PyObject_*`` entry points); chains through CPython's allocator entry points are marked
``py`` (so are those whose first caller is in libpython: tracemalloc sees those too,
`crawlerd/memtrace.py`), the rest are C that only this tool sees.
Heap column: ``b`` glibc's brk heap (main arena), ``t`` a thread arena, ``m`` a block mapped alone;
``main``: allocated on the process's main thread (the crawl loop).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "malloc_sites.c")
LIB_NAME = "malloc_sites.so"
# frames that are the allocator, not its caller
ALLOCATOR_FUNCS = {
    "PyMem_RawMalloc", "PyMem_RawCalloc", "PyMem_RawRealloc", "_PyMem_RawMalloc", "_PyMem_RawCalloc",
    "_PyMem_RawRealloc", "PyMem_Malloc", "PyMem_Calloc", "PyMem_Realloc", "PyObject_Malloc",
    "PyObject_Calloc", "PyObject_Realloc", "_PyObject_Malloc", "_PyObject_Calloc", "_PyObject_Realloc",
    "pymalloc_alloc", "pymalloc_realloc", "_PyMem_DebugRawAlloc", "_PyMem_DebugRawRealloc",
    "_PyMem_DebugMalloc", "_PyMem_DebugRealloc", "_PyMem_DebugCalloc", "PyMem_RawMalloc.part.0",
}
PY_ENTRY = re.compile(r"^_?Py(Mem|Object)_")


def build(out_dir: str) -> str:
    """Compile `malloc_sites.c` into ``out_dir``; the library's path. gcc must be on PATH."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("malloc_sites: no C compiler (gcc) on PATH")
    os.makedirs(out_dir, exist_ok=True)
    lib = os.path.join(os.path.abspath(out_dir), LIB_NAME)
    # no sibling calls: the hook's own frame must stay on the stack for the chain to skip it
    subprocess.run([gcc, "-O2", "-g", "-fPIC", "-shared", "-fno-optimize-sibling-calls", "-o", lib, SOURCE,
                    "-pthread", "-ldl"], check=True)
    return lib


def preload_env(lib: str, out_dir: str, start_s: float, every_s: float, depth: int = 8) -> dict[str, str]:
    """The environment that makes a process load the counter and dump into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    return {"LD_PRELOAD": lib, "MALLOC_SITES_OUT": os.path.join(os.path.abspath(out_dir), "sites"),
            "MALLOC_SITES_START_S": str(start_s), "MALLOC_SITES_DUMP_S": str(every_s),
            "MALLOC_SITES_DEPTH": str(depth)}


# --- reading dumps ---------------------------------------------------------------------------------

def read_dump(path: str) -> dict:
    """One dump: its header fields, its chains ``{(heap, main, addrs): (live_bytes, live_blocks,
    allocs)}`` and its memory map lines."""
    chains: dict[tuple, tuple[int, int, int]] = {}
    maps: list[str] = []
    head: dict[str, str] = {}
    with open(path) as f:
        in_maps = False
        for line in f:
            if in_maps:
                maps.append(line.rstrip("\n"))
            elif line.startswith("# malloc_sites"):
                words = line.split()[2:]
                head = dict(zip(words[::2], words[1::2], strict=False))
            elif line.startswith("## maps"):
                in_maps = True
            elif line.strip():
                live, blocks, allocs, heap, main, addrs = line.split()
                key = (heap, int(main), tuple(int(a, 16) for a in addrs.split(",")))
                old = chains.get(key, (0, 0, 0))
                chains[key] = (old[0] + int(live), old[1] + int(blocks), old[2] + int(allocs))
    return {"path": path, "t_s": float(head.get("t_s", 0)), "head": head, "chains": chains, "maps": maps}


def dumps_in(directory: str, pid: int | None = None, with_exit: bool = False) -> list[dict]:
    """The dumps in ``directory`` (of ``pid``, or of the process with the most dumps), in time
    order; the one written at exit (after the interpreter freed its objects) only if it is the only
    one or ``with_exit``."""
    paths = glob.glob(os.path.join(directory, "sites.*.*.txt"))
    by_pid: dict[int, list[str]] = defaultdict(list)
    for p in paths:
        parts = os.path.basename(p).split(".")
        by_pid[int(parts[1])].append(p)
    if not by_pid:
        return []
    chosen = pid if pid is not None else max(by_pid, key=lambda k: len(by_pid[k]))
    dumps = sorted((read_dump(p) for p in by_pid.get(chosen, [])),
                   key=lambda d: (d["t_s"], d["head"].get("why") == "exit"))
    during = [d for d in dumps if d["head"].get("why") != "exit"]
    return dumps if with_exit or not during else during


class Resolver:
    """Addresses to ``function (file:line)`` through the dump's memory map and ``addr2line``
    (batched per module); what cannot be named reads ``module+0xoffset``."""

    def __init__(self, maps: list[str]) -> None:
        self.ranges: list[tuple[int, int, str, int]] = []      # start, end, path, load base
        bases: dict[str, int] = {}
        rows = []
        for line in maps:
            p = line.split(None, 5)
            if len(p) < 6 or not p[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in p[0].split("-"))
            path = p[5].strip()
            rows.append((lo, hi, path))
            if int(p[2], 16) == 0 and path not in bases:
                bases[path] = lo
        for lo, hi, path in rows:
            base = bases.get(path, lo)
            self.ranges.append((lo, hi, path, 0 if _is_exec(path) else base))
        self.ranges.sort()
        self.names: dict[int, str] = {}
        self.modules: dict[int, str] = {}       # address -> its module's path ("" when unmapped)

    def module(self, addr: int) -> tuple[str, int] | None:
        for lo, hi, path, base in self.ranges:
            if lo <= addr < hi:
                return path, addr - base
        return None

    def resolve(self, addrs) -> None:
        todo: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for a in set(addrs) - set(self.names):
            m = self.module(a)
            self.modules[a] = m[0] if m else ""
            if m is None:
                self.names[a] = hex(a)
            else:
                todo[m[0]].append((a, m[1]))
        tool = shutil.which("addr2line")
        for path, items in todo.items():
            short = os.path.basename(path)
            results: list[tuple[str, str]] = []
            if tool and os.path.exists(path):
                # a return address points past its call: the call's line is at the byte before
                out = subprocess.run([tool, "-f", "-C", "-e", path, *(hex(off - 1) for _, off in items)],
                                     capture_output=True, text=True).stdout.splitlines()
                results = list(zip(out[::2], out[1::2], strict=False))
            for i, (a, off) in enumerate(items):
                func, where = results[i] if i < len(results) else ("??", "??:0")
                where = where.split(" (discriminator")[0]
                if func == "??":
                    self.names[a] = f"{short}+{off:#x}"
                elif where.startswith("??"):
                    self.names[a] = f"{func} ({short})"
                else:
                    self.names[a] = f"{func} ({os.path.basename(where)})"

    def name(self, addr: int) -> str:
        return self.names.get(addr, hex(addr))


def _is_exec(path: str) -> bool:
    """An ELF executable linked at a fixed address (ET_EXEC): its addresses are used as they are."""
    try:
        with open(path, "rb") as f:
            head = f.read(18)
    except OSError:
        return False
    return head[:4] == b"\x7fELF" and int.from_bytes(head[16:18], "little") == 2


def _func(name: str) -> str:
    return name.split(" (", 1)[0]


def caller(frames: list[tuple[str, str]]) -> tuple[int, bool]:
    """The index of the first frame (name, module) that is not the allocator (glibc's, this tool's,
    CPython's entry points), and whether the block is the interpreter's (a Python object or buffer,
    which tracemalloc sees too): the chain went through CPython's allocator entry points, or its
    first caller is in libpython (whose entry points the compiler may have tail-called away)."""
    py = False
    for i, (name, module) in enumerate(frames):
        f = _func(name)
        if f in ALLOCATOR_FUNCS or PY_ENTRY.match(f):
            py = True
            continue
        base = os.path.basename(module)
        if base.startswith(("libc.so", LIB_NAME)):
            continue
        return i, py or base.startswith(("libpython", "python"))
    return 0, py


def pages_at(samples: list[dict], t_s: float) -> float | None:
    """Pages fetched at ``t_s`` seconds into the crawl, interpolated between a soak's samples (the
    dumps' clock starts when the crawl process starts, the samples' a few ms before: close enough)."""
    pts = [(s["t_s"], s["pages"]) for s in samples]
    for (t0, p0), (t1, p1) in zip(pts, pts[1:], strict=False):
        if t0 <= t_s <= t1:
            return p0 + (p1 - p0) * (t_s - t0) / (t1 - t0) if t1 > t0 else p1
    if pts and 0 <= t_s - pts[-1][0] < 10:     # a dump just after the last sample
        return pts[-1][1]
    return None


def report(dumps: list[dict], top: int = 25, from_s: float | None = None, depth: int = 6,
           samples: list[dict] | None = None) -> list[str]:
    """The ranked chains: live at the last dump, and grown from the first dump at or after
    ``from_s`` (the first dump when None) to the last, each with its live KiB at every dump; with a
    soak's ``samples``, the pages fetched at each dump and the growth per page between the two."""
    if not dumps:
        return ["no dumps"]
    first = next((d for d in dumps if from_s is None or d["t_s"] >= from_s), dumps[0])
    last = dumps[-1]
    res = Resolver(last["maps"])
    keys = set().union(*(d["chains"] for d in dumps))
    res.resolve(a for k in keys for a in k[2])
    # one row per (caller chain as named, heap, main): addresses that resolve alike merge
    rows: dict[tuple, list[int]] = {}
    chain_names: dict[tuple, list[str]] = {}
    for k in keys:
        names = [res.name(a) for a in k[2]]
        start, py = caller([(n, res.modules.get(a, "")) for n, a in zip(names, k[2], strict=True)])
        shown = tuple(names[start:start + depth])
        rk = (shown, k[0], k[1], py)
        chain_names[rk] = list(shown)
        series = rows.setdefault(rk, [0] * len(dumps))
        for i, d in enumerate(dumps):
            series[i] += d["chains"].get(k, (0, 0, 0))[0]
    i0, i1 = dumps.index(first), len(dumps) - 1
    h = last["head"]
    out = [f"{len(dumps)} dumps, pid {h.get('pid')}, t {dumps[0]['t_s']:.0f} .. {last['t_s']:.0f} s; recording "
           f"from {h.get('start_s')} s; at the last: {int(h.get('live_bytes', 0)) / 2**20:.2f} MiB live in "
           f"{h.get('live_blocks')} blocks, {h.get('chains')} chains, {h.get('dropped')} blocks not recorded",
           "dumps at (s): " + " ".join(f"{d['t_s']:.0f}" for d in dumps)]
    per_page = None
    if samples:
        pages = [pages_at(samples, d["t_s"]) for d in dumps]
        out.append("pages at the dumps: " + " ".join("-" if p is None else f"{p:.0f}" for p in pages))
        if pages[i0] is not None and pages[i1] is not None and pages[i1] > pages[i0]:
            per_page = pages[i1] - pages[i0]
            out.append(f"growth per page below: over the {per_page:.0f} pages from {first['t_s']:.0f} s to "
                       f"{last['t_s']:.0f} s")
    tot_b = [sum(v[i] for (_, heap, _, _), v in rows.items() if heap == "b") for i in range(len(dumps))]
    out.append("brk heap (b), all chains, KiB: " + " ".join(f"{v / 1024:.0f}" for v in tot_b))
    rankings = [(f"live at {last['t_s']:.0f} s", lambda kv: -kv[1][i1])]
    if i1 > i0:
        rankings.insert(0, (f"grown from {first['t_s']:.0f} s to {last['t_s']:.0f} s",
                            lambda kv: -(kv[1][i1] - kv[1][i0])))
    out.append(f"--- by call site (the chains' first frame, summed), grown {first['t_s']:.0f} -> {last['t_s']:.0f} s "
               "and live at the end, KiB")
    by_site: dict[tuple, list[int]] = {}
    for (shown, heap, main, py), series in rows.items():
        acc = by_site.setdefault((shown[0] if shown else "?", heap, main, py), [0] * len(dumps))
        for i, v in enumerate(series):
            acc[i] += v
    for (site, heap, main, py), series in sorted(by_site.items(), key=lambda kv: -kv[1][i1])[:top]:
        bpp = f"{(series[i1] - series[i0]) / per_page:+7.2f} B/page " if per_page else ""
        out.append(f"{(series[i1] - series[i0]) / 1024:+9.1f}  {bpp}now {series[i1] / 1024:9.1f}  {heap} "
                   f"{'main' if main else 'thrd'} {'py' if py else 'C '}  {site}   "
                   + " ".join(f"{v / 1024:.0f}" for v in series))
    for title, order in rankings:
        out.append(f"--- {title} (KiB at every dump; heap, main thread, py: through CPython's allocator)")
        for rk, series in sorted(rows.items(), key=order)[:top]:
            shown, heap, main, py = rk
            bpp = f"{(series[i1] - series[i0]) / per_page:+7.2f} B/page " if per_page else ""
            out.append(f"{(series[i1] - series[i0]) / 1024:+9.1f} KiB {bpp} now {series[i1] / 1024:9.1f}  {heap} "
                       f"{'main' if main else 'thrd'} {'py' if py else 'C '}  {shown[0]}")
            out.append("      " + " ".join(f"{v / 1024:.0f}" for v in series))
            for n in shown[1:]:
                out.append(f"        < {n}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("directory", nargs="?", help="the dumps' directory")
    p.add_argument("--build", metavar="DIR", help="only build the library into DIR and print its path")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--from", dest="from_s", type=float, default=None, help="growth from the first dump at or after")
    p.add_argument("--depth", type=int, default=6, help="frames shown per chain, from its caller on")
    p.add_argument("--pid", type=int, default=None)
    p.add_argument("--with-exit", action="store_true", help="also the dump written at exit")
    p.add_argument("--soak", metavar="JSON", help="a soak_bench.py JSON of the same crawl: pages at each dump")
    args = p.parse_args(argv)
    if args.build:
        print(build(args.build))
        return 0
    if not args.directory:
        p.error("a directory of dumps, or --build DIR")
    samples = None
    if args.soak:
        with open(args.soak) as f:
            samples = json.load(f)["runs"][0]["samples"]
    print("\n".join(report(dumps_in(args.directory, args.pid, args.with_exit), args.top, args.from_s, args.depth,
                           samples)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
