"""End-to-end benchmark: crawlerd and a Scrapy peer crawl the same synthetic web in one run.

    nice -n 10 .venv/bin/python bench/e2e_bench.py [--hosts 20000] [--seeds 3000] [--seconds 90] [--runs 1]
        [--schemes http,https] [--profile web] [--no-peer] [--py-spy DIR] [--thread-names]

Everything happens inside a private network namespace that has only ``lo`` (the script re-runs
itself under ``unshare -n`` and refuses to run anywhere else), so no request can leave the
machine. For each crawl a fresh simweb starts with the same seed, bound to 0.0.0.0 so that every
host answers on its own 127.x.y.z; the crawler runs for ``--seconds`` as a subprocess; then the
server ledger judges it. Runs alternate which crawler goes first.

- crawlerd: ``crawlerd run --duration D`` with a temp data dir, a User-Agent with a contact,
  ``network.allow = ["127.0.0.0/8"]`` and simweb's names in ``dns.static_hosts``. CPU by process
  comes from its ``last-run.json`` (``cpu_by_process_s``); WARC segments are checked with
  ``crawlerd warc verify``.
- scrapy: ``bench/peers/scrapy_peer.py`` in its own mount namespace (``unshare -m``) with a
  temporary /etc/hosts bind-mounted over the real one, because Scrapy resolves names with the
  system resolver. Its CPU is the kernel's account of the process (wait4).

Measured the same way for both: pages (answered non-robots requests in the ledger), pages/s over
the crawl window (requests that started within D seconds of the crawler's launch), CPU ms per
page by process, simweb's own CPU per page (/proc/<pid>/stat), peak RSS of the crawler's
process family (sampled VmRSS, summed over the family), and from the ledger: politeness
(host overlap, host gap below max(min gap, Crawl-delay), per-IP concurrency), robots and
Retry-After violations. With ``--runs N`` the table shows medians, and violations summed.

Steady state: the same figures over the part of the crawl window after ``--warmup-s`` (default a
third of D): pages/s, CPU µs per page and per request of each process (crawl process, workers,
simweb; from /proc samples at the window's ends), refetches (a non-robots URL asked for again).
For crawlerd the bench also polls ``status`` on its control socket every second: in-flight
transfers over time and the crawl loop's lag histogram (``shards[0].loop_lag``), whose p99.9 over the steady
window is reported. ``--schemes http,https`` crawls the same web over each scheme (simweb
``--tls``: a throwaway CA that crawlerd trusts through ``fetch.ca_file``). ``--py-spy DIR`` records
a py-spy profile of crawlerd's crawl process and first worker over the steady window. The JSON's
steady figures hold each thread of the crawl process (CPU µs and KiB written per request, by
thread id); ``--thread-names`` names them (the LMDB writer is ``crawlerd-writer``) through the
``bench/thread_names`` start-up hook, and prints them per run.

What the bench watches in a running crawl (/proc samples, the status poller, py-spy) is in
``e2e_watch.py``; the summary over runs and its tables in ``e2e_tables.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

# bench/ is on sys.path when a script there runs: its siblings import by name
from e2e_tables import print_stalls, print_table, summarize
from e2e_watch import FamilySampler, PySpy, StatusPoller, proc_cpu_s, process_family

from crawlerd.simweb import SimWebProcess
from crawlerd.simweb.ledger import (
    HOST_GAP,
    HOST_OVERLAP,
    IP_CONCURRENCY,
    LedgerEntry,
    crawl_delays,
    politeness_violations,
    retry_after_violations,
    robots_violations,
)
from crawlerd.simweb.netns import in_private_netns

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peers", "scrapy_peer.py")
THREAD_NAMES_HOOK = os.path.join(HERE, "thread_names")      # bench only: --thread-names
CRAWLERD_UA = "crawlerd-bench/0.1 (+synthetic web on loopback; operator: bench@localhost)"
ROBOTS_AGENT = "crawlerd"         # robots.agent_token; the peer is matched with the same token
MIN_GAP_S = 1.0                   # politeness.min_delay_s, and the peer's DOWNLOAD_DELAY
PER_IP_CONCURRENCY = 1            # politeness.per_ip_concurrency
STOP_GRACE_S = 20.0               # after D, a crawler has this long to exit before SIGTERM
KILL_GRACE_S = 15.0               # after SIGTERM, this long before SIGKILL


def wait_bounded(proc: subprocess.Popen, deadline: float, name: str) -> tuple[int, float]:
    """Wait for ``proc`` until ``deadline`` (monotonic), then SIGTERM, a second SIGTERM 5 s later
    (Scrapy's "force unclean shutdown"; crawlerd ignores a repeat), then SIGKILL.

    Returns (exit status, CPU seconds of the process and the children it reaped, from wait4).
    Signals go to this one process by pid, nothing else.
    """
    signalled = []
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            if signalled:
                print(f"  ({name} needed {', '.join(signalled)} to stop)", file=sys.stderr)
            return proc.returncode, ru.ru_utime + ru.ru_stime
        now = time.monotonic()
        if now >= deadline and not signalled:
            proc.send_signal(signal.SIGTERM)
            signalled.append("SIGTERM")
        elif now >= deadline + 5.0 and len(signalled) == 1:
            proc.send_signal(signal.SIGTERM)
            signalled.append("SIGTERM")
        elif now >= deadline + KILL_GRACE_S and len(signalled) == 2:
            proc.kill()
            signalled.append("SIGKILL")
        time.sleep(0.05)


# --- the judge -------------------------------------------------------------------------------

def robots_paths(site: dict) -> dict[str, set[str]]:
    """Host -> the paths of its robots.txt redirect chain (not pages)."""
    return {name: set(h["robots"]["paths"]) for name, h in site["hosts"].items()}


def judge(entries: list[LedgerEntry], site: dict, t_launch: float, seconds: float, warmup_s: float) -> dict:
    """Everything the server ledger says about one crawl; the same rules for every crawler."""
    rpaths = robots_paths(site)
    pages = [e for e in entries if e.status and e.path not in rpaths.get(e.host, ())]
    in_window = [e for e in pages if t_launch <= e.t_start < t_launch + seconds]
    t0, t1 = t_launch + warmup_s, t_launch + seconds
    steady_pages = sum(1 for e in pages if t0 <= e.t_start < t1)
    steady_requests = sum(1 for e in entries if t0 <= e.t_start < t1)
    asked = Counter((e.host, e.target) for e in entries if e.path not in rpaths.get(e.host, ()))
    refetches = sum(n - 1 for n in asked.values() if n > 1)
    pol = politeness_violations(entries, MIN_GAP_S, PER_IP_CONCURRENCY,
                                host_min_gap_s=crawl_delays(site, ROBOTS_AGENT))
    rob = robots_violations(entries, site, agent=ROBOTS_AGENT)
    ra = retry_after_violations(entries)
    kinds = Counter(v.kind for v in pol)
    return {
        "requests": len(entries),
        "robots_requests": sum(1 for e in entries if e.path in rpaths.get(e.host, ())),
        "pages": len(pages),
        "pages_2xx": sum(1 for e in pages if 200 <= e.status < 300),
        "pages_in_window": len(in_window),
        "pages_per_s": len(in_window) / seconds,
        "steady_pages": steady_pages, "steady_requests": steady_requests,
        "steady_pages_per_s": steady_pages / max(1e-9, seconds - warmup_s),
        "refetches": refetches, "refetch_share": refetches / max(1, len(entries)),
        "hosts_touched": len({e.host for e in entries}),
        "hosts_paged": len({e.host for e in pages}),        # hosts reached: at least one page asked
        "politeness": {k: kinds.get(k, 0) for k in (HOST_OVERLAP, HOST_GAP, IP_CONCURRENCY)},
        "robots": dict(Counter(v.kind for v in rob)),
        "retry_after": len(ra),
        "examples": [str(v) for v in (pol[:3] + rob[:3] + ra[:3])],
    }


def save_ledger(entries: list[LedgerEntry], work: str) -> None:
    """The ledger next to the crawl's data (kept with --keep) for a closer look."""
    with open(os.path.join(work, "ledger.jsonl"), "w", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps(e.to_dict(), separators=(",", ":")) + "\n")


# --- one crawl each --------------------------------------------------------------------------

@dataclass
class CrawlResult:
    crawler: str
    rc: int
    judged: dict
    cpu_by_process_s: dict[str, float]       # process label -> CPU seconds
    cpu_total_s: float
    simweb_cpu_s: float
    peak_rss_kib: int
    hwm_kib: dict[str, int]                  # process label -> VmHWM
    self_pages: int | None = None            # the crawler's own page count
    self_pages_per_s: float | None = None
    warc: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    steady: dict = field(default_factory=dict)   # the window after warm-up: CPU per page, stalls, in flight
    scheme: str = "http"


def steady_figures(sampler: FamilySampler, root: int, sim_pid: int | None, judged: dict,
                   t0: float, t1: float) -> dict:
    """CPU per page and per request of each process over [t0, t1] (from /proc samples)."""
    covered, used = sampler.cpu_between(t0, t1)
    pages, requests = judged["steady_pages"], judged["steady_requests"]
    if not covered or not pages:
        return {}
    scale = (t1 - t0) / covered           # samples straddle the window by up to one interval
    crawl = used.get(root, 0.0) * scale
    sim = used.get(sim_pid, 0.0) * scale if sim_pid else 0.0
    workers = sum(v for pid, v in used.items() if pid not in (root, sim_pid)) * scale
    us = 1e6
    return {"window_s": round(t1 - t0, 1), "pages": pages, "requests": requests,
            "pages_per_s": judged["steady_pages_per_s"],
            "crawl_us_per_page": us * crawl / pages, "crawl_us_per_request": us * crawl / max(1, requests),
            "workers_us_per_page": us * workers / pages, "all_us_per_page": us * (crawl + workers) / pages,
            "simweb_us_per_request": us * sim / max(1, requests),
            "threads": _thread_figures(sampler, t0, t1, requests)}


def _thread_figures(sampler: FamilySampler, t0: float, t1: float, requests: int) -> list[dict]:
    """The crawl process's threads over [t0, t1], by thread id (creation order): CPU µs and bytes
    written (KiB) per request. Python 3.11 does not name OS threads: which is the LMDB writer is
    read from the order, or from a log of ``threading.get_native_id()`` at each thread's start."""
    covered, used = sampler.threads_between(t0, t1)
    if not covered:
        return []
    scale, n = (t1 - t0) / covered, max(1, requests)
    return [{"tid": tid, "us_per_request": round(1e6 * cpu * scale / n, 1),
             "kib_written_per_request": round(w * scale / n / 1024, 2) if w >= 0 else None}
            for tid, (cpu, w) in sorted(used.items())]


def _name_threads(threads: list[dict], log_path: str, pid: int) -> None:
    """Each thread's name from the ``--thread-names`` log (the process's first thread: "loop")."""
    names = {pid: "loop"}
    try:
        with open(log_path) as f:
            for line in f:
                tid, _, name = line.rstrip("\n").partition(" ")
                names[int(tid)] = name
    except OSError:
        pass
    for t in threads:
        t["name"] = names.get(t["tid"], "?")


def _crawlerd_config(data_dir: str, sim: SimWebProcess, work: str) -> tuple[str, list[str]]:
    """(config file, -s overrides) for one crawl: the name table goes in the file (20,000 names do
    not fit on a command line), the rest as overrides."""
    sets = [f"crawl.data_dir={json.dumps(data_dir)}", f"crawl.user_agent={json.dumps(CRAWLERD_UA)}",
            'network.allow=["127.0.0.0/8"]', 'log.level="warning"',
            f"robots.agent_token={json.dumps(ROBOTS_AGENT)}",
            f"politeness.min_delay_s={MIN_GAP_S}", f"politeness.per_ip_concurrency={PER_IP_CONCURRENCY}"]
    path = os.path.join(work, "crawlerd.toml")
    with open(path, "w") as f:
        if sim.dns_port:
            sets.append(f'dns.nameservers=["127.0.0.1:{sim.dns_port}"]')
        else:
            f.write("[dns.static_hosts]\n")
            f.writelines(f"{json.dumps(h)} = {json.dumps(ip)}\n" for h, ip in sim.static_hosts.items())
    return path, sets


def warc_verify(warc_dir: str) -> dict:
    """``crawlerd warc verify`` on every segment; valid iff it exits 0 and there is a segment."""
    files = sorted(os.path.join(warc_dir, f) for f in os.listdir(warc_dir)) if os.path.isdir(warc_dir) else []
    segs = [f for f in files if ".warc" in os.path.basename(f)]
    if not segs:
        return {"segments": 0, "valid": False, "records": 0, "output": "no WARC segments"}
    r = subprocess.run([sys.executable, "-m", "crawlerd", "warc", "verify", *segs], capture_output=True,
                       text=True, timeout=600)
    records = 0
    for line in r.stdout.splitlines():
        words = line.rsplit(": ", 1)[-1].split()
        if len(words) >= 2 and words[1] == "records" and words[0].isdigit():
            records += int(words[0])
    return {"segments": len(segs), "valid": r.returncode == 0, "rc": r.returncode, "records": records,
            "output": (r.stdout + r.stderr)[-2000:]}


def run_crawlerd(sim: SimWebProcess, seeds_path: str, args: argparse.Namespace, work: str,
                 extra_sets: list[str], tag: str) -> CrawlResult:
    seconds, warmup = args.seconds, args.warmup
    data_dir = os.path.join(work, "crawlerd-data")
    config, sets = _crawlerd_config(data_dir, sim, work)
    # -P: crawlerd from that interpreter's install, not from the current directory's tree
    cmd = [args.crawlerd_python, "-P", "-m", "crawlerd", "run", "--config", config, "--seeds", seeds_path,
           "--duration", str(seconds)]
    sets += extra_sets
    if sim.ca_file:
        sets.append(f"fetch.ca_file={json.dumps(sim.ca_file)}")
    for s in sets:
        cmd += ["-s", s]
    stderr_path = os.path.join(work, "crawlerd.stderr")
    sim_cpu0 = proc_cpu_s(sim.pid)
    t_launch = time.monotonic()
    env, names_dir = None, os.path.join(work, "thread-names")
    if args.thread_names:
        os.makedirs(names_dir, exist_ok=True)
        env = {**os.environ, "CRAWLERD_THREAD_NAMES": names_dir,
               "PYTHONPATH": os.pathsep.join(filter(None, [THREAD_NAMES_HOOK, os.environ.get("PYTHONPATH")]))}
    with open(stderr_path, "w") as err:
        # cwd: the work dir, so neither crawlerd nor the workers it starts import this tree by accident
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, cwd=work,
                                env=env)
    sampler = FamilySampler(proc.pid)
    sampler.extra_pids = [sim.pid]
    sampler.start()
    poller = StatusPoller(os.path.join(data_dir, "control.sock"))
    poller.start()
    spy = PySpy(args.py_spy)
    try:
        if args.py_spy:
            time.sleep(max(0.0, t_launch + warmup - time.monotonic()))
            kids = [p for p in process_family(proc.pid) if p != proc.pid]
            spy.start({"crawl": proc.pid, **({"worker": kids[0]} if kids else {})}, seconds - warmup - 2, tag)
        rc, wait4_cpu = wait_bounded(proc, t_launch + seconds + STOP_GRACE_S, "crawlerd")
    finally:
        sampler.stop()
        poller.stop()
        spy.wait()
    sim_cpu = proc_cpu_s(sim.pid) - sim_cpu0
    entries, site = sim.ledger(), sim.site()
    save_ledger(entries, work)
    last: dict = {}
    try:
        with open(os.path.join(data_dir, "last-run.json")) as f:
            last = json.load(f)
    except (OSError, ValueError):
        pass
    cpu_by: dict[str, float] = {}
    for k, v in last.get("cpu_by_process_s", {}).items():
        label = "crawl" if k == "crawl" else "workers"      # workers summed: one per core by default
        cpu_by[label] = cpu_by.get(label, 0.0) + v
    workers = sum(1 for k in last.get("cpu_by_process_s", {}) if k != "crawl")
    hwm = {("crawl" if pid == proc.pid else f"worker-{pid}"): kib for pid, kib in sampler.hwm_kib.items()}
    with open(stderr_path, errors="replace") as f:
        tail = f.read()[-3000:]
    judged = judge(entries, site, t_launch, seconds, warmup)
    steady = steady_figures(sampler, proc.pid, sim.pid, judged, t_launch + warmup, t_launch + seconds)
    steady.update(poller.steady(t_launch + warmup, t_launch + seconds))
    if args.thread_names:
        _name_threads(steady.get("threads", []), os.path.join(names_dir, f"threads.{proc.pid}.log"), proc.pid)
    return CrawlResult(
        crawler="crawlerd", rc=rc, judged=judged, steady=steady, scheme=sim.info.get("scheme", "http"),
        cpu_by_process_s=cpu_by, cpu_total_s=last.get("cpu_s", wait4_cpu), simweb_cpu_s=sim_cpu,
        peak_rss_kib=sampler.peak_rss_kib, hwm_kib=hwm, self_pages=last.get("pages"),
        self_pages_per_s=(last["pages"] / last["uptime_s"]) if last.get("uptime_s") else None,
        warc=warc_verify(os.path.join(data_dir, "warc")),
        extra={"workers": workers, "cpu_by_process_raw_s": last.get("cpu_by_process_s", {}),
               "wait4_cpu_s": round(wait4_cpu, 3), "uptime_s": last.get("uptime_s"),
               "last_run_found": bool(last), "outcomes": last.get("outcomes", {}),
               "dropped": last.get("dropped", {}), "stderr_tail": tail if rc != 0 else "",
               # jobs per answer frame: the workers' mean batch over the run (bench/RESULTS.md, fifth pass)
               "worker_batches": {k: sum((s.get("worker_batches") or {}).get(k, 0) for s in last.get("shards", []))
                                  for k in ("frames", "jobs")},
               # curl's new vs reused connections (NUM_CONNECTS per transfer) and the frontier's
               # working-set sessions, whole run
               "connections": {k: sum(((s.get("fetcher") or {}).get("connections") or {}).get(k, 0)
                                      for s in last.get("shards", [])) for k in ("new", "reused")},
               # bodies pooled / fallen back to the heap / sent inline, the pool's cap (fetch.body_pool_bytes)
               # and the most of it in use at once (summed over shards: each shard has its own pool)
               "body_pool": {**{k: sum((s.get("body_pool_fallbacks") or {}).get(k, 0) for s in last.get("shards", []))
                                for k in ("pooled", "fetched", "inline")},
                             **{k: sum(((s.get("memory") or {}).get("body_pool") or {}).get(k, 0)
                                       for s in last.get("shards", [])) for k in ("cap_bytes", "high_water_bytes")}},
               "sessions_started": sum((s.get("frontier") or {}).get("sessions_started", 0)
                                       for s in last.get("shards", [])),
               # the URL-seen DRUM's jobs (trips to its thread) and their time on it, whole run
               "seen_jobs": {k: sum((s.get("seen") or {}).get(k, 0) for s in last.get("shards", []))
                             for k in ("jobs", "busy_s", "delivered")}})


def hosts_file_text(static_hosts: dict[str, str]) -> str:
    """An /etc/hosts for the peer: localhost plus one line per synthetic host."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost"]
    lines += [f"{ip} {name}" for name, ip in sorted(static_hosts.items())]
    return "\n".join(lines) + "\n"


def peer_command(hosts_path: str, seeds_path: str, seconds: float, out_path: str) -> list[str]:
    """The peer in a fresh mount namespace (private propagation, unshare(1)'s default) whose
    /etc/hosts is ``hosts_path``; the real /etc/hosts is never written. No fork: the pid we
    start is the peer's Python process."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount --bind "$0" /etc/hosts && exec "$@"', hosts_path,
            sys.executable, PEER, "--seeds", seeds_path, "--seconds", str(seconds), "--out", out_path,
            "--robots-agent", ROBOTS_AGENT, "--delay-s", str(MIN_GAP_S)]


def run_scrapy(sim: SimWebProcess, seeds_path: str, args: argparse.Namespace, work: str) -> CrawlResult:
    seconds, warmup = args.seconds, args.warmup
    hosts_path = os.path.join(work, "hosts")
    with open(hosts_path, "w") as f:
        f.write(hosts_file_text(sim.static_hosts))
    out_path = os.path.join(work, "scrapy-peer.json")
    stderr_path = os.path.join(work, "scrapy.stderr")
    sim_cpu0 = proc_cpu_s(sim.pid)
    t_launch = time.monotonic()
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(peer_command(hosts_path, seeds_path, seconds, out_path),
                                stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
    sampler = FamilySampler(proc.pid)
    sampler.extra_pids = [sim.pid]
    sampler.start()
    try:
        rc, wait4_cpu = wait_bounded(proc, t_launch + seconds + STOP_GRACE_S, "scrapy")
    finally:
        sampler.stop()
    sim_cpu = proc_cpu_s(sim.pid) - sim_cpu0
    entries, site = sim.ledger(), sim.site()
    save_ledger(entries, work)
    rep: dict = {}
    try:
        with open(out_path) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        pass
    with open(stderr_path, errors="replace") as f:
        tail = f.read()[-3000:]
    stats = rep.get("stats", {})
    judged = judge(entries, site, t_launch, seconds, warmup)
    steady = steady_figures(sampler, proc.pid, sim.pid, judged, t_launch + warmup, t_launch + seconds)
    return CrawlResult(
        crawler="scrapy", rc=rc, judged=judged, steady=steady, scheme=sim.info.get("scheme", "http"),
        cpu_by_process_s={"scrapy": wait4_cpu}, cpu_total_s=wait4_cpu, simweb_cpu_s=sim_cpu,
        peak_rss_kib=sampler.peak_rss_kib, hwm_kib={"scrapy": max(sampler.hwm_kib.values(), default=0)},
        self_pages=rep.get("pages"),
        self_pages_per_s=(rep["pages"] / rep["wall_s"]) if rep.get("wall_s") else None,
        warc={"segments": 0, "valid": None, "records": 0, "output": "Scrapy writes no WARC"},
        extra={"version": rep.get("crawler", ""), "self_cpu_s": rep.get("cpu_s"), "wall_s": rep.get("wall_s"),
               "close_reason": rep.get("close_reason", ""),
               "robots": {k: v for k, v in stats.items() if k.startswith("robotstxt/")},
               "retries": stats.get("retry/count", 0), "report_found": bool(rep),
               "stderr_tail": tail if rc != 0 or not rep else ""})


# --- driver ----------------------------------------------------------------------------------

def pick_seeds(seeds: list[str], n: int, seed: int) -> list[str]:
    """``n`` of simweb's seeds (one per host), the same sample for every crawl of a run."""
    if n <= 0 or n >= len(seeds):
        return list(seeds)
    import random
    return sorted(random.Random(f"e2e-seeds/{seed}").sample(seeds, n))


def one_crawl(kind: str, scheme: str, args: argparse.Namespace, root: str, run: int) -> CrawlResult:
    tag = f"run{run}-{kind}-{scheme}"
    work = os.path.join(root, tag)
    os.makedirs(work)
    with SimWebProcess(hosts=args.hosts, seed=args.seed, bind="0.0.0.0", profile=args.profile,
                       tls=scheme == "https") as sim:
        seeds_path = os.path.join(work, "seeds.txt")
        with open(seeds_path, "w") as f:
            f.write("\n".join(pick_seeds(sim.seeds, args.seeds, args.seed)) + "\n")
        if kind == "crawlerd":
            return run_crawlerd(sim, seeds_path, args, work, list(args.set or []), tag)
        return run_scrapy(sim, seeds_path, args, work)


def code_version(python: str = sys.executable) -> str:
    """The commit benchmarked (the tree ``python`` imports crawlerd from), and whether crawlerd/
    differed from it (numbers are only comparable between runs of the same code)."""
    try:
        root = subprocess.run([python, "-P", "-c", "import crawlerd, os; print(os.path.dirname(os.path.dirname("
                               "os.path.abspath(crawlerd.__file__))))"], capture_output=True, text=True,
                              timeout=30).stdout.strip() or os.path.dirname(HERE)
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "crawlerd"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}{' + uncommitted changes' if dirty else ''}"


def bench(args: argparse.Namespace) -> dict:
    kinds = ["crawlerd"] + ([] if args.no_peer else ["scrapy"])
    schemes = args.schemes
    root = tempfile.mkdtemp(prefix="crawlerd-e2e-")
    results: dict[str, list[CrawlResult]] = {f"{k}/{sc}": [] for sc in schemes for k in kinds}
    try:
        for run in range(args.runs):
            order = kinds if run % 2 == 0 else kinds[::-1]
            for kind, scheme in [(k, sc) for sc in schemes for k in order]:
                print(f"run {run + 1}/{args.runs}: {kind} over {scheme} for {args.seconds:g} s on {args.hosts} "
                      f"hosts ...", file=sys.stderr, flush=True)
                r = one_crawl(kind, scheme, args, root, run)
                j = r.judged
                print(f"  {kind}: {j['pages']} pages ({j['pages_in_window']} in window), "
                      f"CPU {r.cpu_total_s:.2f}s, politeness {j['politeness']}, robots {j['robots']}, "
                      f"retry-after {j['retry_after']}, exit {r.rc}", file=sys.stderr, flush=True)
                if r.extra.get("stderr_tail"):
                    print(r.extra["stderr_tail"], file=sys.stderr)
                if r.warc.get("valid") is False:
                    print(f"  WARC verify failed (exit {r.warc.get('rc')}):\n{r.warc['output']}", file=sys.stderr)
                st = r.steady
                if st:
                    print(f"  steady: {st.get('pages_per_s', 0):.1f} pages/s, crawl {st.get('crawl_us_per_request', 0):.0f}"
                          f" us/request, workers {st.get('workers_us_per_page', 0):.0f} us/page, all "
                          f"{st.get('all_us_per_page', 0):.0f} us/page, stall p99.9 {st.get('stall_p999_ms')} ms, "
                          f"in flight {st.get('in_flight', {})}", file=sys.stderr, flush=True)
                    named = [t for t in st.get("threads", []) if "name" in t and t["us_per_request"] >= 1]
                    if named:
                        print("  threads (us/request, KiB written/request): " + ", ".join(
                            f"{t['name']} {t['us_per_request']:.0f} ({t['kib_written_per_request']})" for t in named),
                            file=sys.stderr, flush=True)
                    cn = r.extra.get("connections") or {}
                    print(f"  connections: {cn.get('new', 0)} new, {cn.get('reused', 0)} reused; hosts reached "
                          f"{r.judged.get('hosts_paged', 0)}; working-set sessions {r.extra.get('sessions_started', 0)}"
                          f" (whole run)", file=sys.stderr, flush=True)
                    wb = r.extra.get("worker_batches") or {}
                    if wb.get("frames"):
                        print(f"  workers' batches: {wb['jobs'] / wb['frames']:.2f} jobs per answer frame "
                              f"({wb['frames']} frames, whole run)", file=sys.stderr, flush=True)
                    sj = r.extra.get("seen_jobs") or {}
                    if sj.get("jobs") and r.extra.get("uptime_s"):
                        print(f"  URL-seen DRUM: {sj['jobs'] / r.extra['uptime_s']:.1f} jobs/s, busy {sj['busy_s']:.1f} s "
                              f"(whole run)", file=sys.stderr, flush=True)
                    print_stalls(st)
                    for site in st.get("stall_sites") or []:
                        split = (f", waiting for a CPU {site['runq_s'] * 1000:.0f} ms, GC {site['gc_s'] * 1000:.0f} ms"
                                 if "runq_s" in site else "")
                        print(f"    stall site (over the watch threshold) x{site['stalls']} (worst {site['worst_s'] * 1000:.0f} ms{split}): "
                              f"{site['where']}", file=sys.stderr)
                results[f"{kind}/{scheme}"].append(r)
    finally:
        if args.keep:
            print(f"kept work dir {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    summary = {k: summarize(v) for k, v in results.items() if v}
    version = code_version(args.crawlerd_python)
    print_table(summary, args.runs, args.hosts, args.seconds)
    print(f"code: {version}")
    out = {"hosts": args.hosts, "seeds": args.seeds, "profile": args.profile, "warmup_s": args.warmup,
           "seconds": args.seconds, "runs": args.runs, "seed": args.seed,
           "code": version, "summary": summary,
           "results": {k: [r.__dict__ for r in v] for k, v in results.items()}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


def reexec_in_netns(argv: list[str], script: str | None = None) -> int:
    """Run this script (or ``script``) again inside a fresh network namespace with only ``lo`` up."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        print("e2e_bench: needs root with unshare(1) and ip(8) for a private network namespace; "
              "refusing to run outside one", file=sys.stderr)
        return 2
    cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
           sys.executable, script or os.path.abspath(__file__), *argv, "--inside-netns"]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hosts", type=int, default=20000, help="synthetic hosts")
    p.add_argument("--seeds", type=int, default=3000, help="seed URLs (a fixed sample of host roots; 0: all)")
    p.add_argument("--profile", default="web", choices=("web", "uniform"), help="simweb --profile")
    p.add_argument("--schemes", default="http", type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
                   help="comma-separated: http, https (simweb --tls)")
    p.add_argument("--seconds", type=float, default=90.0, help="crawl duration per crawler per run")
    p.add_argument("--warmup-s", dest="warmup", type=float, default=None,
                   help="steady-state figures start this long after launch (default: a third of --seconds)")
    p.add_argument("--py-spy", metavar="DIR", help="record py-spy profiles of crawlerd's processes into DIR")
    p.add_argument("--runs", type=int, default=1, help="repeat; the table shows medians")
    p.add_argument("--seed", type=int, default=1, help="simweb seed (the same web for every crawl)")
    p.add_argument("--no-peer", action="store_true", help="crawlerd only")
    p.add_argument("-s", "--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="extra crawlerd config override (repeatable)")
    p.add_argument("--json", metavar="FILE", help="also write all results as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp work dir (data dirs, logs)")
    p.add_argument("--crawlerd-python", default=sys.executable, metavar="PYTHON",
                   help="interpreter whose crawlerd is crawled with (another tree's .venv/bin/python, for "
                        "an A/B against the same simweb and bench)")
    p.add_argument("--thread-names", action="store_true",
                   help="name the crawl process's threads in the steady figures (bench/thread_names hook)")
    p.add_argument("--inside-netns", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.hosts < 1 or args.seconds <= 0 or args.runs < 1:
        print("e2e_bench: need --hosts >= 1, --seconds > 0, --runs >= 1", file=sys.stderr)
        return 2
    if args.warmup is None:
        args.warmup = args.seconds / 3
    if not 0 <= args.warmup < args.seconds or not set(args.schemes) <= {"http", "https"} or not args.schemes:
        print("e2e_bench: need 0 <= --warmup-s < --seconds and --schemes from http,https", file=sys.stderr)
        return 2
    if not in_private_netns():
        if args.inside_netns:
            print("e2e_bench: not in a private network namespace after unshare; refusing to run", file=sys.stderr)
            return 2
        return reexec_in_netns(argv)
    if not args.no_peer and not os.path.exists(PEER):
        print(f"e2e_bench: peer script missing: {PEER}", file=sys.stderr)
        return 2
    bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
