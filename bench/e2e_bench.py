"""End-to-end benchmark: crawlerd and a Scrapy peer crawl the same synthetic web in one run.

    nice -n 10 .venv/bin/python bench/e2e_bench.py [--hosts 200] [--seconds 30] [--runs 1] [--no-peer]

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
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

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
CRAWLERD_UA = "crawlerd-bench/0.1 (+synthetic web on loopback; operator: bench@localhost)"
ROBOTS_AGENT = "crawlerd"         # robots.agent_token; the peer is matched with the same token
MIN_GAP_S = 1.0                   # politeness.min_delay_s, and the peer's DOWNLOAD_DELAY
PER_IP_CONCURRENCY = 1            # politeness.per_ip_concurrency
SAMPLE_INTERVAL_S = 0.2
STOP_GRACE_S = 20.0               # after D, a crawler has this long to exit before SIGTERM
KILL_GRACE_S = 15.0               # after SIGTERM, this long before SIGKILL
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- /proc -------------------------------------------------------------------------------------

def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of one live process, seconds (proc(5) stat fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields_ = data[data.rindex(b")") + 2:].split()
    return (int(fields_[11]) + int(fields_[12])) / CLK_TCK


def proc_ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[1])


def proc_status_kib(pid: int, key: str) -> int | None:
    """A ``kB`` line of /proc/<pid>/status (VmRSS, VmHWM), KiB."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def process_family(root: int) -> list[int]:
    """``root`` and all its live descendants (one pass over /proc; no children file needed)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            pp = proc_ppid(int(name))
            if pp is not None:
                parent[int(name)] = pp
    family, frontier = [root], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        family += kids
        frontier += kids
    return family


class FamilySampler(threading.Thread):
    """Samples a process family's memory every ``interval_s`` until stopped.

    State: ``peak_rss_kib`` is the largest sum of VmRSS over the family seen in one sample;
    ``hwm_kib[pid]`` the last VmHWM (the kernel's own peak, monotonic) seen per process;
    ``cpu_s[pid]`` the last utime+stime seen per process (a process's CPU just before it exits).
    """

    def __init__(self, root: int, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.interval_s = interval_s
        self.peak_rss_kib = 0
        self.hwm_kib: dict[int, int] = {}
        self.cpu_s: dict[int, float] = {}
        self.samples = 0
        self._stop_evt = threading.Event()

    def sample(self) -> None:
        total = 0
        for pid in process_family(self.root):
            rss = proc_status_kib(pid, "VmRSS")
            hwm = proc_status_kib(pid, "VmHWM")
            cpu = proc_cpu_s(pid)
            if rss is None or hwm is None or cpu is None:
                continue
            total += rss
            self.hwm_kib[pid] = max(self.hwm_kib.get(pid, 0), hwm)
            self.cpu_s[pid] = cpu
        self.peak_rss_kib = max(self.peak_rss_kib, total)
        self.samples += 1

    def run(self) -> None:
        while not self._stop_evt.is_set():
            self.sample()
            self._stop_evt.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join()


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


def judge(entries: list[LedgerEntry], site: dict, t_launch: float, seconds: float) -> dict:
    """Everything the server ledger says about one crawl; the same rules for every crawler."""
    rpaths = robots_paths(site)
    pages = [e for e in entries if e.status and e.path not in rpaths.get(e.host, ())]
    in_window = [e for e in pages if t_launch <= e.t_start < t_launch + seconds]
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
        "hosts_touched": len({e.host for e in entries}),
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


def _crawlerd_sets(data_dir: str, sim: SimWebProcess) -> list[str]:
    table = ", ".join(f"{json.dumps(h)} = {json.dumps(ip)}" for h, ip in sim.static_hosts.items())
    sets = [f"crawl.data_dir={json.dumps(data_dir)}", f"crawl.user_agent={json.dumps(CRAWLERD_UA)}",
            'network.allow=["127.0.0.0/8"]', 'log.level="warning"',
            f"robots.agent_token={json.dumps(ROBOTS_AGENT)}",
            f"politeness.min_delay_s={MIN_GAP_S}", f"politeness.per_ip_concurrency={PER_IP_CONCURRENCY}"]
    if sim.dns_port:
        sets.append(f'dns.nameservers=["127.0.0.1:{sim.dns_port}"]')
    else:
        sets.append(f"dns.static_hosts={{{table}}}")
    return sets


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


def run_crawlerd(sim: SimWebProcess, seeds_path: str, seconds: float, work: str, extra_sets: list[str]) -> CrawlResult:
    data_dir = os.path.join(work, "crawlerd-data")
    cmd = [sys.executable, "-m", "crawlerd", "run", "--seeds", seeds_path, "--duration", str(seconds)]
    for s in _crawlerd_sets(data_dir, sim) + extra_sets:
        cmd += ["-s", s]
    stderr_path = os.path.join(work, "crawlerd.stderr")
    sim_cpu0 = proc_cpu_s(sim.pid)
    t_launch = time.monotonic()
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
    sampler = FamilySampler(proc.pid)
    sampler.start()
    try:
        rc, wait4_cpu = wait_bounded(proc, t_launch + seconds + STOP_GRACE_S, "crawlerd")
    finally:
        sampler.stop()
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
    return CrawlResult(
        crawler="crawlerd", rc=rc, judged=judge(entries, site, t_launch, seconds),
        cpu_by_process_s=cpu_by, cpu_total_s=last.get("cpu_s", wait4_cpu), simweb_cpu_s=sim_cpu,
        peak_rss_kib=sampler.peak_rss_kib, hwm_kib=hwm, self_pages=last.get("pages"),
        self_pages_per_s=(last["pages"] / last["uptime_s"]) if last.get("uptime_s") else None,
        warc=warc_verify(os.path.join(data_dir, "warc")),
        extra={"workers": workers, "cpu_by_process_raw_s": last.get("cpu_by_process_s", {}),
               "wait4_cpu_s": round(wait4_cpu, 3), "uptime_s": last.get("uptime_s"),
               "last_run_found": bool(last), "outcomes": last.get("outcomes", {}),
               "dropped": last.get("dropped", {}), "stderr_tail": tail if rc != 0 else ""})


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


def run_scrapy(sim: SimWebProcess, seeds_path: str, seconds: float, work: str) -> CrawlResult:
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
    return CrawlResult(
        crawler="scrapy", rc=rc, judged=judge(entries, site, t_launch, seconds),
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

def one_crawl(kind: str, args: argparse.Namespace, root: str, run: int) -> CrawlResult:
    work = os.path.join(root, f"run{run}-{kind}")
    os.makedirs(work)
    with SimWebProcess(hosts=args.hosts, seed=args.seed, bind="0.0.0.0") as sim:
        seeds_path = os.path.join(work, "seeds.txt")
        with open(seeds_path, "w") as f:
            f.write("\n".join(sim.seeds) + "\n")
        if kind == "crawlerd":
            return run_crawlerd(sim, seeds_path, args.seconds, work, list(args.set or []))
        return run_scrapy(sim, seeds_path, args.seconds, work)


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(results: list[CrawlResult]) -> dict:
    """Medians of the performance numbers over runs of one crawler; violations summed."""
    def per_page(r: CrawlResult, cpu: float) -> float | None:
        return 1000 * cpu / r.judged["pages"] if r.judged["pages"] else None

    labels = sorted({k for r in results for k in r.cpu_by_process_s})
    return {
        "runs": len(results),
        "pages": _median([r.judged["pages"] for r in results]),
        "pages_in_window": _median([r.judged["pages_in_window"] for r in results]),
        "pages_per_s": _median([r.judged["pages_per_s"] for r in results]),
        "self_pages_per_s": _median([r.self_pages_per_s for r in results]),
        "cpu_ms_per_page": _median([per_page(r, r.cpu_total_s) for r in results]),
        "cpu_ms_per_page_by_process": {k: _median([per_page(r, r.cpu_by_process_s.get(k, 0.0)) for r in results])
                                       for k in labels},
        "simweb_cpu_ms_per_page": _median([per_page(r, r.simweb_cpu_s) for r in results]),
        "peak_rss_mib": _median([r.peak_rss_kib / 1024 for r in results]),
        "politeness": dict(sum((Counter(r.judged["politeness"]) for r in results), Counter())),
        "robots": dict(sum((Counter(r.judged["robots"]) for r in results), Counter())),
        "retry_after": sum(r.judged["retry_after"] for r in results),
        "warc_valid": (None if all(r.warc.get("valid") is None for r in results)
                       else all(r.warc.get("valid") for r in results)),
        "exit_codes": [r.rc for r in results],
    }


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def print_table(summary: dict[str, dict], runs: int, hosts: int, seconds: float) -> None:
    print(f"\n=== end-to-end: {hosts} hosts, {seconds:g} s per crawl, "
          f"{runs} run(s): medians; violations summed over runs ===")
    head = (f"{'crawler':9} {'pages':>6} {'window':>6} {'pages/s':>7} {'self/s':>6} {'CPU ms/pg':>9}  "
            f"{'by process (ms/page)':24} {'simweb ms/pg':>12} {'peak RSS':>8} {'polite viol':>20} "
            f"{'robots':>6} {'retry-aft':>9} {'WARC':>4}")
    print(head)
    print("-" * len(head))
    for name, s in summary.items():
        by = " ".join(f"{k} {_f(v, '.2f')}" for k, v in s["cpu_ms_per_page_by_process"].items())
        pol = s["politeness"]
        polite = (f"{sum(pol.values())} (o{pol.get(HOST_OVERLAP, 0)} g{pol.get(HOST_GAP, 0)} "
                  f"ip{pol.get(IP_CONCURRENCY, 0)})")
        warc = "-" if s["warc_valid"] is None else ("ok" if s["warc_valid"] else "BAD")
        print(f"{name:9} {_f(s['pages'], '6.0f')} {_f(s['pages_in_window'], '6.0f')} "
              f"{_f(s['pages_per_s'], '7.1f')} {_f(s['self_pages_per_s'], '6.1f')} "
              f"{_f(s['cpu_ms_per_page'], '9.2f')}  {by:24} {_f(s['simweb_cpu_ms_per_page'], '12.2f')} "
              f"{_f(s['peak_rss_mib'], '6.0f')}Mi {polite:>20} {sum(s['robots'].values()):6d} "
              f"{s['retry_after']:9d} {warc:>4}")
    if "crawlerd" in summary and "scrapy" in summary:
        c, p = summary["crawlerd"], summary["scrapy"]
        if c["pages_per_s"] and p["pages_per_s"] and c["cpu_ms_per_page"] and p["cpu_ms_per_page"]:
            print(f"\ncrawlerd / scrapy: pages/s x{c['pages_per_s'] / p['pages_per_s']:.2f}, "
                  f"CPU per page x{c['cpu_ms_per_page'] / p['cpu_ms_per_page']:.2f}, "
                  f"peak RSS x{c['peak_rss_mib'] / p['peak_rss_mib']:.2f}")
    print("\npages: answered non-robots requests in the server ledger over the whole run; window: those that "
          "started\nwithin D s of launch; pages/s = window / D; self/s: the crawler's own count / its own wall "
          "time;\nCPU per page = CPU of the whole run / pages; polite viol: o = host overlap, g = host gap < "
          "max(1 s, Crawl-delay),\nip = more than 1 request in flight per IP")
    for name, s in summary.items():
        print(f"{name}: robots violations by kind {s['robots'] or '{}'}; exit codes {s['exit_codes']}")


def code_version() -> str:
    """The commit benchmarked, and whether crawlerd/ differed from it (numbers are only
    comparable between runs of the same code)."""
    root = os.path.dirname(HERE)
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "crawlerd"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}{' + uncommitted changes' if dirty else ''}"


def bench(args: argparse.Namespace) -> dict:
    kinds = ["crawlerd"] + ([] if args.no_peer else ["scrapy"])
    root = tempfile.mkdtemp(prefix="crawlerd-e2e-")
    results: dict[str, list[CrawlResult]] = {k: [] for k in kinds}
    try:
        for run in range(args.runs):
            order = kinds if run % 2 == 0 else kinds[::-1]
            for kind in order:
                print(f"run {run + 1}/{args.runs}: {kind} for {args.seconds:g} s on {args.hosts} hosts ...",
                      file=sys.stderr, flush=True)
                r = one_crawl(kind, args, root, run)
                j = r.judged
                print(f"  {kind}: {j['pages']} pages ({j['pages_in_window']} in window), "
                      f"CPU {r.cpu_total_s:.2f}s, politeness {j['politeness']}, robots {j['robots']}, "
                      f"retry-after {j['retry_after']}, exit {r.rc}", file=sys.stderr, flush=True)
                if r.extra.get("stderr_tail"):
                    print(r.extra["stderr_tail"], file=sys.stderr)
                if r.warc.get("valid") is False:
                    print(f"  WARC verify failed (exit {r.warc.get('rc')}):\n{r.warc['output']}", file=sys.stderr)
                results[kind].append(r)
    finally:
        if args.keep:
            print(f"kept work dir {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    summary = {k: summarize(v) for k, v in results.items() if v}
    version = code_version()
    print_table(summary, args.runs, args.hosts, args.seconds)
    print(f"code: {version}")
    out = {"hosts": args.hosts, "seconds": args.seconds, "runs": args.runs, "seed": args.seed,
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
    p.add_argument("--hosts", type=int, default=200, help="synthetic hosts")
    p.add_argument("--seconds", type=float, default=30.0, help="crawl duration per crawler per run")
    p.add_argument("--runs", type=int, default=1, help="repeat; the table shows medians")
    p.add_argument("--seed", type=int, default=1, help="simweb seed (the same web for every crawl)")
    p.add_argument("--no-peer", action="store_true", help="crawlerd only")
    p.add_argument("-s", "--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="extra crawlerd config override (repeatable)")
    p.add_argument("--json", metavar="FILE", help="also write all results as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp work dir (data dirs, logs)")
    p.add_argument("--inside-netns", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.hosts < 1 or args.seconds <= 0 or args.runs < 1:
        print("e2e_bench: need --hosts >= 1, --seconds > 0, --runs >= 1", file=sys.stderr)
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
