"""Soak: does RAM stay flat while the URLs seen and queued pile up on disk? (ARCHITECTURE.md invariant 4)

A large simweb (every host a seed, so all hosts are active from the first seconds) is crawled by
`crawlerd run` for a fixed time inside a private network namespace (only `lo`). Every
``--interval`` seconds the crawl process and each processing worker are sampled from
/proc/<pid>/status (VmRSS, VmHWM, RssAnon, RssFile) and the daemon's stats (the reply of
`crawlerd stats --json`, read from the same control socket) give pages, URLs seen, queued and
active hosts.

After the warm-up (the daemon's RAM caps are full and every host has been taken up), RSS is fitted
by least squares against URLs seen (the unique URLs the seen-set admitted). Keeping URLs in RAM
costs at least their text plus a Python object (~100+ bytes each); a slope of a few bytes per URL
means they live on disk. Two slopes are reported per process: RSS (what `ps` shows) and RssAnon
(private heap). The difference, RssFile, is the page cache of memory-mapped files (LMDB maps,
shared libraries; LMDB maps them read-only, no writemap): clean pages the kernel reclaims under
pressure, which grow with the data on disk by design.

The RAM caps are set small by default (``--caps small``), so that they fill during the warm-up and
the fit measures what is left, growth without a cap; ``--caps default`` keeps the shipped ones.
The ratios printed at the end compare the slope with the bytes per URL of an in-RAM seen-set (a
set of URL strings, a set of 64-bit fingerprints) measured in the same process.

    nice -n 10 .venv/bin/python bench/soak_bench.py --runs 3 --seconds 120 --hosts 2000
    .venv/bin/python bench/soak_bench.py OUT.json --seconds 300 ...   # also writes every sample as JSON

Outside a network namespace whose only interface is `lo`, the script re-runs itself in one
(`unshare -n`, needs root): simweb binds 0.0.0.0 and nothing but loopback is reachable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from soak_analysis import MEM_FIELDS, analyse, caps_full, fit, floor_points, warmup_end  # noqa: F401 (read here by the tests)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# RAM caps of the `small` profile: each fills within the warm-up of a few-minute soak
SMALL_CAPS = [
    "drum.cache_entries=65536",             # seen-set's recent-fingerprint cache (512 KiB)
    "drum.bucket_buffer_bytes=65536",       # 64 buckets x 64 KiB of keys waiting for disk
    "budgets.edge_cache_entries=65536",     # recent domain edges
    "budgets.cache_entries=4096",           # domain budget LRU
    "url_filter.state_bytes=4194304",       # parameter values remembered (trap guard)
    "dedup.near_index_ram_bytes=4194304",   # near-duplicate delta: flushed to disk every ~35,000 pages
    "dedup.host_windows_bytes=1048576",     # per-host near-duplicate windows
    "dedup.worker_captures_bytes=1048576",  # a worker's own first captures, not yet in the digest set
    "dust.cache_bytes=4194304",             # DUST host states decoded (they grow with each host's pages)
    "robots.cache_bytes=4194304",           # parsed robots.txt rules
    # the overlays' read caches: recrawl URL states (~400 B a URL: the shipped 16 MiB fills only
    # after ~80 k pages, past a 10-minute soak's warm-up) and BEAST's host turns (~270 B a host)
    "recrawl.read_cache_bytes=4194304",
    "budgets.read_cache_bytes=4194304",
    "dns.cache_bytes=4194304",              # DNS answers
    # the queue heads of the working set's hosts: ~2.5-3.6 MiB in use at its default size through a
    # 20,000-host soak, so 2 MiB is full ~15 s in and stays full (the shipped 8 MiB never fills, and
    # their count kept rising to ~845 s, inside the fit)
    "frontier.queue_heads_bytes=2097152",
    # DRUM answers a merge's keys in one batch (URLs with their aux bytes): merging every 5 s
    # instead of 30 s keeps that transient batch, and so the noise on the fitted slopes, small
    "drum.max_age_s=5",
    "budgets.edge_max_age_s=5",
]
# a transient bound's extra fields kept per sample: its peak over the last 2-4 s, its keys and layers,
# the steps that waited for room and the largest one (memory.budget_unlanded, dust_unlanded, frontier_unlanded)
TRANSIENT_FIELDS = ("peak_bytes", "entries", "layers", "waits", "wait_s", "largest_step_bytes")
# the seen-set's pending keys by where they wait (`crawlerd stats` shards[].seen): the batch in RAM and
# the one the DRUM thread is taking, DRUM's buckets (waiting for a merge), merged and not handed out;
# a delivery outstanding; the merges (count, last and longest, s) and the DRUM thread's busy time
SEEN_FIELDS = ("pending", "queued_keys", "inflight_keys", "unmerged", "ready", "outstanding", "merges",
               "last_merge_s", "max_merge_s", "last_flush_s", "backpressure", "busy_s", "jobs", "delivered")
DIAG_ENV = "CRAWLERD_MEMDIAG"   # crawlerd/allocator.py: `stats` malloc.diag (both allocators' arenas)
STOP_GRACE_S = 120.0        # drain + checkpoint after --duration, before the soak gives up on the daemon


def in_private_netns() -> bool:
    # if_nameindex asks the kernel about the caller's namespace (/sys/class/net shows the mounter's)
    return [name for _, name in socket.if_nameindex()] == ["lo"]


# --- sampling -----------------------------------------------------------------------------------

_MEM_FIELDS = MEM_FIELDS


def proc_mem(pid: int) -> dict[str, int] | None:
    """Memory of one process from /proc/<pid>/status, bytes; None once it has gone."""
    from crawlerd.metrics import proc_status_bytes
    out = proc_status_bytes(pid, _MEM_FIELDS)
    return out if out and "VmRSS" in out else None


def smaps_groups(pid: int, data_dir: str) -> dict[str, int] | None:
    """Resident bytes of one process by kind of mapping (/proc/<pid>/smaps): ``heap`` (brk heap),
    ``anon`` (other anonymous maps: malloc arenas of threads, large arrays), ``libs``, ``stack``,
    and each mapped file under the data dir by its relative path (the LMDB stores)."""
    try:
        with open(f"/proc/{pid}/smaps") as f:
            text = f.read()
    except OSError:
        return None
    out: dict[str, int] = {}
    group = "anon"
    root = os.path.abspath(data_dir) + os.sep
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and not head[0].endswith(":"):
            name = head[5].strip() if len(head) > 5 else ""
            if name == "[heap]":
                group = "heap"
            elif name.startswith("[stack"):
                group = "stack"
            elif not name or name.startswith("[anon"):
                group = "anon"
            elif name.startswith(root):
                group = name[len(root):]
            elif name.startswith("["):
                group = "kernel"
            else:
                group = "libs"
        elif line.startswith("Rss:"):
            out[group] = out.get(group, 0) + int(line.split()[1]) * 1024
    return out


_PAGE = 4096
_PFN_MASK = (1 << 55) - 1


def _anon_maps(pid: int) -> list[tuple[int, int, str]]:
    """The writable anonymous mappings of ``pid`` (brk heap and stacks included): (start, end, name)."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            p = line.split(None, 5)
            name = p[5].strip() if len(p) > 5 else ""
            if p[1][:2] == "rw" and (not name or name == "[heap]" or name.startswith(("[anon", "[stack"))):
                lo, hi = (int(x, 16) for x in p[0].split("-"))
                out.append((lo, hi, name))
    return out


def anon_blocks(pid: int) -> dict | None:
    """The crawl process's anonymous memory split into glibc's blocks mapped alone and the rest, each
    with its resident bytes (``--diag``). A block mapped alone (an allocation of at least
    malloc.mmap_threshold_bytes) starts on a page with a chunk header whose size is a whole number
    of pages with the IS_MMAPPED bit: each such block is ``[start, size, rss, first bytes]`` in
    ``chunks`` (the first 24 bytes after the header, hex: enough to tell a DRUM bucket buffer, a
    dict's table or an LMDB page list apart), and the stretches between them ``[start, size, rss,
    name]`` in ``rest`` (name "[heap]", "[stack]" or "other": thread arenas are the 64 MiB-aligned
    ones, Python's arenas 1 MiB maps). The kernel merges neighbouring anonymous maps, so a
    region-level record cannot follow one block; this one can. Pages read through
    /proc/<pid>/mem are only those already resident (pagemap), so the scan faults nothing in; the
    shared zero page (a read of a never-written page) does not count as resident."""
    try:
        maps = _anon_maps(pid)
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        pm = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    except OSError:
        os.close(mem)
        return None
    chunks, rest = [], []
    try:
        entries = {}
        counts: dict[int, int] = {}
        for lo, hi, _ in maps:
            raw = os.pread(pm, 8 * ((hi - lo) // _PAGE), (lo // _PAGE) * 8)
            vals = [int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8)]
            entries[lo] = vals
            for v in vals:
                if v >> 63:
                    counts[v & _PFN_MASK] = counts.get(v & _PFN_MASK, 0) + 1
        # the zero page: the one frame many pages map (without CAP_SYS_ADMIN every frame reads 0)
        zero = max(counts, key=counts.get) if counts else -1
        if zero == 0 or counts.get(zero, 0) < 16:
            zero = -1
        for lo, hi, name in maps:
            present = [bool(v >> 63) and (v & _PFN_MASK) != zero for v in entries[lo]]

            def rss(a: int, b: int, lo=lo, present=present) -> int:
                return sum(present[(a - lo) // _PAGE:(b - lo) // _PAGE]) * _PAGE
            if name:
                rest.append([lo, hi - lo, rss(lo, hi), name])
                continue
            a = gap = lo
            while a < hi:
                size = 0
                if present[(a - lo) // _PAGE]:
                    try:
                        head = os.pread(mem, 40, a)
                    except OSError:
                        head = b""
                    if len(head) == 40:
                        prev, word = int.from_bytes(head[:8], "little"), int.from_bytes(head[8:16], "little")
                        size = word & ~7
                        if not (word & 7 == 2 and size >= _PAGE and size % _PAGE == 0 and a + size <= hi
                                and prev < _PAGE):
                            size = 0
                if not size:
                    a += _PAGE
                    continue
                if gap < a:
                    rest.append([gap, a - gap, rss(gap, a), "other"])
                chunks.append([a, size, rss(a, a + size), head[16:40].hex()])
                a = gap = a + size
            if gap < hi:
                rest.append([gap, hi - gap, rss(gap, hi), "other"])
    except OSError:
        return None
    finally:
        os.close(mem)
        os.close(pm)
    return {"chunks": chunks, "rest": rest}


def daemon_stats(sock: str) -> dict | None:
    """The daemon's `stats` reply (what `crawlerd stats --json` prints), None while it does not answer."""
    from crawlerd import control
    try:
        reply = control.request(sock, "stats", timeout_s=10.0)
    except (control.ControlError, OSError):      # not up yet, or going away (connection reset)
        return None
    return reply if reply.get("ok", True) else None


def seen_unique(st: dict) -> int:
    """Unique URLs the seen-set admitted: queued into the frontier or deferred by a domain budget."""
    return int(st.get("frontier", {}).get("added", 0)) + int(st.get("counters", {}).get("budget_deferred", 0))


def take_sample(t_s: float, crawl_pid: int, st: dict, data_dir: str, diag: bool = False) -> dict:
    workers = sorted(int(k.split("-", 1)[1]) for k in st.get("cpu_by_process_s", {}) if k.startswith("worker-"))
    fr = st.get("frontier", {})
    counters = st.get("counters", {})
    seen = seen_unique(st)
    seen_view = (st.get("shards") or [{}])[0].get("seen", {})
    mem = {"crawl": proc_mem(crawl_pid)}
    for pid in workers:
        mem[f"worker-{pid}"] = proc_mem(pid)
    return {"t_s": round(t_s, 2), "pages": st.get("pages", 0), "seen": seen,
            "checked": seen + int(counters.get("seen_duplicate", 0)),
            "queued": st.get("queued", 0), "deferred": int(counters.get("budget_deferred", 0)),
            "hosts_active": fr.get("hosts_active", st.get("hosts_active", 0)),
            "hosts_total": fr.get("hosts_total", 0), "seen_pending": st.get("seen_pending", 0),
            "seen_parts": {f: seen_view[f] for f in SEEN_FIELDS if f in seen_view},
            # pages a worker failed to process (a bug: archived raw, no links): a soak with them
            # measures a different crawl
            "process_errors": int(counters.get("process_process_error", 0)),
            "mem": {k: v for k, v in mem.items() if v is not None}, "malloc": st.get("malloc", {}),
            # a bound on a transient (the budget store's unlanded writes) also gives its recent peak
            "components_full": {k: {"bytes": v.get("bytes", 0), "cap_bytes": v.get("cap_bytes", 0),
                                    **{f: v[f] for f in TRANSIENT_FIELDS if f in v}}
                                for k, v in st.get("memory", {}).items()},
            "unlanded": {k: {f: v[f] for f in ("bytes", "peak_bytes", "entries", "layers") if f in v}
                         for k, v in st.get("unlanded", {}).items()},
            "crawl_maps": smaps_groups(crawl_pid, data_dir) or {},
            **({"crawl_blocks": anon_blocks(crawl_pid) or {}} if diag else {})}


def du_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


# --- the crawl -----------------------------------------------------------------------------------

def crawl_command(data_dir: str, seeds: str, seconds: float, static_hosts: dict[str, str],
                  caps: str, workers: int, extra: list[str]) -> list[str]:
    # the host table goes in a config file: for 20,000 hosts it is larger than one argv string may be
    conf = os.path.join(os.path.dirname(os.path.abspath(data_dir)), "soak-config.toml")
    with open(conf, "w") as f:
        f.write("[dns]\nstatic_hosts = {" + ", ".join(f'"{h}" = "{ip}"' for h, ip in static_hosts.items())
                + "}\n")
    sets = ["crawl.user_agent=crawlerd-soak/0.1 (+soak; operator: test@localhost)",
            'network.allow=["127.0.0.0/8"]',
            "fetch.shutdown_grace_s=15.0", f"process.workers={workers}",
            *(SMALL_CAPS if caps == "small" else []), *extra]
    cmd = [sys.executable, "-m", "crawlerd", "run", "--config", conf, "--seeds", seeds, "--data-dir", data_dir,
           "--duration", str(seconds)]
    for s in sets:
        cmd += ["-s", s]
    return cmd


def soak(sim, data_dir: str, seconds: float, interval_s: float, caps: str, workers: int,
         extra: list[str], log=None, diag: bool = False, crawl_env: dict[str, str] | None = None) -> dict:
    """Crawl ``sim`` for ``seconds``, sampling every ``interval_s``; the samples and the run's end
    state. ``crawl_env``: more environment for the crawl process (the malloc-sites preload)."""
    os.makedirs(data_dir, exist_ok=True)
    seeds = os.path.join(os.path.dirname(os.path.abspath(data_dir)), "soak-seeds.txt")
    with open(seeds, "w") as f:
        f.write("\n".join(sim.seeds) + "\n")
    sock = os.path.join(data_dir, "control.sock")
    cmd = crawl_command(data_dir, seeds, seconds, sim.static_hosts, caps, workers, extra)
    err_path = os.path.join(os.path.dirname(os.path.abspath(data_dir)), "soak-crawl.stderr")
    samples: list[dict] = []
    t0 = time.monotonic()
    with open(err_path, "w+") as err:
        env = dict(os.environ, **({DIAG_ENV: os.environ.get(DIAG_ENV) or "1"} if diag else {}))   # "2" kept
        env.update(crawl_env or {})
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, env=env)
        try:
            next_at = t0 + interval_s
            hard_stop = t0 + seconds + STOP_GRACE_S
            while proc.poll() is None and time.monotonic() < hard_stop:
                time.sleep(max(0.0, min(next_at, hard_stop) - time.monotonic()))
                next_at += interval_s
                st = daemon_stats(sock)
                if st is None or st.get("state") != "running":
                    continue
                s = take_sample(time.monotonic() - t0, proc.pid, st, data_dir, diag)
                samples.append(s)
                if log is not None:
                    log(s)
            # the daemon stops itself after --duration; past the grace it is hung, and that is a finding
            if proc.poll() is None:
                proc.kill()
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        stderr = err.read()
    last = {}
    try:
        with open(os.path.join(data_dir, "last-run.json")) as f:
            last = json.load(f)
    except (OSError, ValueError):
        pass
    disk = {name: du_bytes(os.path.join(data_dir, name)) for name in sorted(os.listdir(data_dir))
            if os.path.isdir(os.path.join(data_dir, name))}
    return {"rc": rc, "wall_s": round(time.monotonic() - t0, 2), "stderr": stderr[-4000:],
            "samples": samples, "last_run": last, "disk_bytes": disk}


# --- analysis: soak_analysis.py ------------------------------------------------------------------

# --- report ---------------------------------------------------------------------------------------

def _mib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def sample_row(s: dict) -> str:
    m = s["mem"]
    workers = [v for k, v in m.items() if k.startswith("worker-")]
    crawl = m.get("crawl", {})
    return (f"{s['t_s']:7.1f} {s['pages']:8d} {s['seen']:10d} {s['queued']:10d} {s['hosts_active']:6d} "
            f"{_mib(crawl.get('VmRSS')):>9} {_mib(crawl.get('RssAnon')):>9} {_mib(crawl.get('VmHWM')):>9} "
            f"{len(workers):3d} {_mib(sum(v['VmRSS'] for v in workers) if workers else None):>9} "
            f"{_mib(sum(v.get('RssAnon', 0) for v in workers) if workers else None):>9}")


HEADER = (f"{'t_s':>7} {'pages':>8} {'seen':>10} {'queued':>10} {'hosts':>6} "
          f"{'crawl_rss':>9} {'crawl_anon':>9} {'crawl_hwm':>9} {'nw':>3} {'wrk_rss':>9} {'wrk_anon':>9}")


def summary_lines(result: dict, a: dict) -> list[str]:
    lines = [f"warm-up: {a['warmup_samples']} samples; fitted over {a['fit_samples']} samples"]
    if "seen_range" in a:
        lines.append(f"  URLs seen {a['seen_range'][0]} -> {a['seen_range'][1]}, pages {a['pages_range'][0]} -> "
                     f"{a['pages_range'][1]}, queued {a['queued_range'][0]} -> {a['queued_range'][1]}, "
                     f"active hosts {a['hosts_active_range'][0]}..{a['hosts_active_range'][1]}; per-page fits "
                     f"over pages {a.get('late_pages_range')}")
    for name, p in a["procs"].items():
        def b(x):
            return "-" if x is None else f"{x:+.2f}"
        lines.append(f"  {name:8s} RSS slope {b(p['rss_slope_b_per_url'])} B/URL (r2 {p['rss_r2'] or 0:.2f}), "
                     f"RssAnon slope {b(p['anon_slope_b_per_url'])} B/URL (r2 {p['anon_r2'] or 0:.2f}, "
                     f"{b(p['anon_slope_b_per_page'])} B/page; floor {b(p['anon_floor_slope_b_per_page'])} B/page; "
                     f"late span {b(p['anon_late_slope_b_per_page'])}, its floor "
                     f"{b(p['anon_late_floor_slope_b_per_page'])} B/page); "
                     f"RSS {_mib(p['rss_first'])} -> {_mib(p['rss_last'])} MiB, anon {_mib(p['anon_first'])} -> "
                     f"{_mib(p['anon_last'])} MiB, HWM {_mib(p['hwm_max'])} MiB")
        if "heap_in_use_slope_b_per_page" in p:
            lines.append(f"  {name:8s} C heap in use {b(p['heap_in_use_slope_b_per_page'])} B/page "
                         f"({_mib(p['heap_in_use_first'])} -> {_mib(p['heap_in_use_last'])} MiB), extent "
                         f"{b(p['heap_extent_slope_b_per_page'])} B/page ({_mib(p['heap_extent_first'])} -> "
                         f"{_mib(p['heap_extent_last'])} MiB), longest trim {p['trim_ms_max']:.1f} ms; "
                         f"RssAnon after trims, floor {b(p['retained_floor_slope_b_per_page'])} B/page")
        ci = p.get("anon_slope_ci95_b_per_page")
        if ci:
            lines.append(f"  {name:8s} RssAnon per page {b(p['anon_slope_b_per_page'])} B/page, 95 % block-bootstrap "
                         f"interval {b(ci[0])} .. {b(ci[1])}; samples' sd about the line {_mib(p['anon_resid_sd'])} MiB")
        if "arenas_first" in p:
            lines.append(f"  {name:8s} Python arenas {p['arenas_first']} -> {p['arenas_last']} MiB, steps at "
                         + (", ".join(f"{t:.0f} s (+{d})" for t, d in p["arena_steps"]) or "none")
                         + f": {b(p['arenas_slope_b_per_page'])} B/page of the slope; allocated blocks "
                         f"{_mib(p['allocated_range'][0])} .. {_mib(p['allocated_range'][1])} MiB")
        for part, (first, last) in p.get("parts_by_thirds", {}).items():
            lines.append(f"  {name:8s} {part}: {first / 2**20:.2f} -> {last / 2**20:.2f} MiB ({(last - first) / 2**20:+.2f}), "
                         "first -> last third of the fit")
    comps = a.get("component_slopes") or {}
    if comps:       # the crawl process's parts, the steepest first: which part of RssAnon's slope grows
        lines.append("  crawl parts over the fit, B/page (first -> last MiB[, of cap]): " + "; ".join(
            f"{k} {c['slope']:+.2f} ({_mib(c['first'])} -> {_mib(c['last'])}"
            + (f" of {_mib(c['cap'])}" if c["cap"] else "") + ")"
            for k, c in sorted(comps.items(), key=lambda kv: -abs(kv[1]["slope"] or 0)) if c["slope"] is not None))
    if a.get("crawl_maps_growth"):
        lines.append("  crawl RSS growth after warm-up by mapping: " + ", ".join(
            f"{k} {v / 2**20:+.1f} MiB" for k, v in sorted(a["crawl_maps_growth"].items(), key=lambda kv: -kv[1])))
    if result["samples"]:
        lines.append(f"  pages a worker failed to process (process_error): {result['samples'][-1].get('process_errors', 0)}")
    lines.append("  disk: " + ", ".join(f"{k} {_mib(v)} MiB" for k, v in result["disk_bytes"].items()))
    lines.append(f"  exit {result['rc']}, wall {result['wall_s']:.0f} s")
    if "checks" in result:
        c = result["checks"]
        lines.append(f"  ledger: {c['requests']} requests, politeness violations {c['politeness_count']}, robots "
                     f"{c['robots_count']}, retry-after {c['retry_after_count']}; WARC {c['warc_records']} "
                     f"records, {len(c['warc_errors'])} errors")
    return lines


# --- entry point ------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("json_out", nargs="?", default="", help="also write samples, analysis and ledger checks here")
    p.add_argument("--seconds", type=float, default=120.0, help="crawl duration (the daemon's --duration)")
    p.add_argument("--hosts", type=int, default=2000, help="simweb hosts (all are seeds)")
    p.add_argument("--min-pages", type=int, default=200, help="simweb pages per host, at least")
    p.add_argument("--max-pages", type=int, default=5000, help="simweb pages per host, at most")
    p.add_argument("--seed", type=int, default=11, help="simweb seed")
    p.add_argument("--runs", type=int, default=1, help="repeat the soak; medians are reported")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--caps", choices=("small", "default"), default="small",
                   help="RAM caps: small ones that fill in the warm-up, or the shipped defaults")
    p.add_argument("--workers", type=int, default=0, help="process.workers (0: cores - 1)")
    p.add_argument("--warmup-fraction", type=float, default=0.3, help="samples always counted as warm-up")
    p.add_argument("--warmup-pages-fraction", type=float, default=0.5,
                   help="the fit starts once this share of the run's pages is fetched")
    p.add_argument("--check-ledger", action="store_true",
                   help="also check politeness/robots on simweb's ledger and verify the WARC (json_out)")
    p.add_argument("--data-dir", default="", help="keep the crawl state here (default: a temp dir, removed)")
    p.add_argument("--diag", action="store_true",
                   help="diagnosis: each sample also holds the crawl process's anonymous memory block by block "
                        "(anon_blocks) and its allocators' arenas (CRAWLERD_MEMDIAG); slower stats, not for a "
                        "measured run")
    p.add_argument("--malloc-sites", metavar="DIR", default="",
                   help="diagnosis: preload bench/malloc_sites.c into the crawl process (built here with gcc) "
                        "and dump the C call chains holding heap bytes into DIR (read: bench/malloc_sites.py DIR)")
    p.add_argument("--malloc-sites-start", type=float, default=300.0,
                   help="seconds into the crawl when --malloc-sites starts recording (after the warm-up)")
    p.add_argument("--malloc-sites-every", type=float, default=60.0, help="seconds between --malloc-sites dumps")
    p.add_argument("-s", "--set", action="append", default=[], dest="sets", help="extra config override")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.seconds > 3600 or args.hosts < 1 or args.hosts > 20000 or args.interval < 0.5 \
            or not 1 <= args.runs <= 10:
        p.error("bounds: 0 < --seconds <= 3600, 1 <= --hosts <= 20000, --interval >= 0.5, 1 <= --runs <= 10")
    return args


def ledger_checks(sim, data_dir: str) -> dict:
    """Zero-violation checks on simweb's ledger and `warc verify` of every segment."""
    from crawlerd.simweb.ledger import (
        crawl_delays,
        politeness_violations,
        retry_after_violations,
        robots_violations,
    )
    from crawlerd.store.verify import verify
    entries, site = sim.ledger(), sim.site()
    pol = politeness_violations(entries, min_gap_s=1.0, per_ip_concurrency=1, host_min_gap_s=crawl_delays(site))
    rob = robots_violations(entries, site, agent="crawlerd")
    ret = retry_after_violations(entries)
    warc_dir = os.path.join(data_dir, "warc")
    names = sorted(os.listdir(warc_dir)) if os.path.isdir(warc_dir) else []
    reports = [verify(os.path.join(warc_dir, n)) for n in names if n.endswith(".warc.gz")]
    answered = sum(1 for e in entries if e.status)
    return {"requests": len(entries), "answered": answered,
            "politeness": [str(v) for v in pol[:20]], "politeness_count": len(pol),
            "robots": [str(v) for v in rob[:20]], "robots_count": len(rob),
            "retry_after": [str(v) for v in ret[:20]], "retry_after_count": len(ret),
            "warc_files": names, "warc_records": sum(r.records for r in reports),
            "warc_responses": sum(r.counts.get("response", 0) + r.counts.get("revisit", 0) for r in reports),
            "warc_errors": [e for r in reports for e in r.errors][:20]}


def in_ram_baseline(n: int = 200_000) -> dict[str, float]:
    """Bytes per URL of keeping URLs in RAM, measured here: a Python set of URL strings shaped like
    simweb's, and a set of 64-bit fingerprints (the least an in-RAM seen-set could hold)."""
    import tracemalloc
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        urls = {f"http://h{i % 2000}.sim:40000/p/{i // 2000}.html" for i in range(n)}
        per_str = (tracemalloc.get_traced_memory()[0] - base) / n
        del urls
        base = tracemalloc.get_traced_memory()[0]
        fps = {(i * 0x9E3779B97F4A7C15) & (2**64 - 1) for i in range(n)}
        per_fp = (tracemalloc.get_traced_memory()[0] - base) / n
        del fps
    finally:
        tracemalloc.stop()
    return {"url_set_b_per_url": per_str, "fp_set_b_per_url": per_fp}


def run_once(args: argparse.Namespace, data_dir: str) -> dict:
    from crawlerd.simweb import SimWebProcess
    crawl_env = None
    if args.malloc_sites:
        import malloc_sites
        lib = malloc_sites.build(args.malloc_sites)
        crawl_env = malloc_sites.preload_env(lib, args.malloc_sites, args.malloc_sites_start,
                                             args.malloc_sites_every)
    with SimWebProcess(hosts=args.hosts, seed=args.seed, bind="0.0.0.0", min_pages=args.min_pages,
                       max_pages=args.max_pages) as sim:
        print(HEADER, flush=True)
        result = soak(sim, data_dir, args.seconds, args.interval, args.caps, args.workers, args.sets,
                      log=lambda s: print(sample_row(s), flush=True), diag=args.diag, crawl_env=crawl_env)
        if args.check_ledger:
            try:
                result["checks"] = ledger_checks(sim, data_dir)
            except (OSError, RuntimeError) as e:    # simweb too slow to answer: keep the memory samples
                result["checks_error"] = repr(e)
    a = analyse(result["samples"], args.hosts, args.warmup_fraction, args.warmup_pages_fraction)
    result["analysis"] = a
    result["summary"] = summary_lines(result, a)
    print("\n".join(result["summary"]), flush=True)
    return result


def medians(runs: list[dict], baseline: dict[str, float]) -> dict:
    """Median over runs of each process's slopes, and their ratio to the in-RAM baselines."""
    out: dict = {}
    for name in ("crawl", "workers"):
        for key in ("rss_slope_b_per_url", "anon_slope_b_per_url", "anon_slope_b_per_page"):
            vals = [r["analysis"]["procs"][name][key] for r in runs
                    if name in r["analysis"]["procs"] and r["analysis"]["procs"][name][key] is not None]
            if vals:
                out.setdefault(name, {})[key] = statistics.median(vals)
        anon = out.get(name, {}).get("anon_slope_b_per_url")
        if anon is not None and "anon_slope_b_per_page" in out[name]:
            out[name]["anon_vs_url_set"] = anon / baseline["url_set_b_per_url"]
            out[name]["anon_vs_fp_set"] = anon / baseline["fp_set_b_per_url"]
    out["pages_per_s"] = statistics.median(r["samples"][-1]["pages"] / r["samples"][-1]["t_s"]
                                           for r in runs if r["samples"])
    out["urls_seen_per_s"] = statistics.median(r["samples"][-1]["seen"] / r["samples"][-1]["t_s"]
                                               for r in runs if r["samples"])
    return out


def run(args: argparse.Namespace) -> dict:
    baseline = in_ram_baseline()
    runs = []
    for i in range(args.runs):
        base = tempfile.mkdtemp(prefix="crawlerd-soak-")
        data_dir = (args.data_dir + (f"-{i}" if i else "")) if args.data_dir else os.path.join(base, "data")
        try:
            print(f"run {i + 1}/{args.runs}", flush=True)
            runs.append(run_once(args, data_dir))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    med = medians(runs, baseline) if runs else {}
    print(f"in-RAM baseline: set of URL strings {baseline['url_set_b_per_url']:.0f} B/URL, set of 64-bit "
          f"fingerprints {baseline['fp_set_b_per_url']:.0f} B/URL")
    for name in ("crawl", "workers"):
        m = med.get(name)
        if m and "anon_vs_url_set" in m:
            print(f"median of {len(runs)} run(s), {name}: RSS {m.get('rss_slope_b_per_url', 0):+.2f} B/URL, "
                  f"RssAnon {m.get('anon_slope_b_per_url', 0):+.2f} B/URL ({m.get('anon_slope_b_per_page', 0):+.1f}"
                  f" B/page) = {m['anon_vs_url_set']:.3f} x URL set, {m['anon_vs_fp_set']:.3f} x fingerprint set")
    if med:
        print(f"median crawl rate: {med['pages_per_s']:.0f} pages/s, {med['urls_seen_per_s']:.0f} URLs seen/s")
    return {"params": {k: v for k, v in vars(args).items() if k != "json_out"}, "baseline": baseline,
            "runs": runs, "medians": med}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not in_private_netns():
        # simweb answers on every 127.x.y.z only inside a namespace whose one interface is lo
        if os.geteuid() != 0 or not shutil.which("unshare"):
            print("soak_bench: needs a private network namespace (root and unshare -n)", file=sys.stderr)
            return 2
        if os.environ.get("CRAWLERD_SOAK_IN_NETNS"):
            print("soak_bench: unshare -n gave a namespace with more than lo", file=sys.stderr)
            return 2
        path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, CRAWLERD_SOAK_IN_NETNS="1", PYTHONPATH=path)
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
               sys.executable, os.path.abspath(__file__), *argv]
        return subprocess.run(cmd, env=env).returncode
    result = run(args)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f)
        return 0        # the caller judges the runs from the JSON
    return 0 if all(r["rc"] == 0 for r in result["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
