"""STAR/BEAST budgets benchmarks: a crawl-shaped stream through the budget parts, and whole crawls.

``crawl`` (the one that matters): whole ``crawlerd run`` crawls of simweb inside a private network
namespace (the script re-runs itself under ``unshare -n``; no request can leave the machine),
each on a fresh simweb and data dir, for ``--seconds``:

* ``farm_on`` / ``farm_off``: ``--hosts`` ordinary hosts plus a link farm (``--farm-domains``
  domains of ``--farm-hosts`` hosts, endless pages linking mostly to each other, ordinary pages
  linking in with probability ``--farm-in-rate``) and ten big legitimate domains (``--giant-hosts``
  hosts each, linked from half the ordinary pages), budgets on (defaults) and off. Reported:
  the farm's share of fetches (counted from the server ledger, farm hosts marked in ``/site``) and
  the fetches of the ten largest legitimate domains with budgets on / off.
* ``one_domain`` / ``per_host``: the same ordinary web with every host under one registered
  domain (``--one-domain``) or one domain per host, budgets on: pages/s of the first over the second.
* In-degree lag: ``crawlerd stats`` sampled every 10 s (age of the oldest edge of the last
  domain-edge merge when it was applied), and its maximum over the crawl.

``--seeds`` seed hosts are drawn from the ordinary hosts (never the farm, never the giants), the
same for every crawl of a run. The two crawls of a ratio (farm on/off, one domain/per host) run
side by side, each on its own simweb, so a shared machine's noise hits both. With ``--runs N`` the
table shows medians. Compare ratios within one invocation.

    nice .venv/bin/python bench/budgets_bench.py crawl --hosts 20000 --seeds 3000 --seconds 600
    nice .venv/bin/python bench/budgets_bench.py crawl --hosts 20000 --seconds 120 --only farm_on,farm_off

``micro``: ``--urls`` new URLs over ``--domains`` registered domains picked by a Zipf law (s = 1.1)
through ``Beast.offer`` (a commit every 1,000), one page in ten recording its links to 8 domains
(``EdgeDrum``), then the reader moving on until every deferred URL passed; against the same rules
on Python containers (in-degree counted plainly, mode "all"), each store in its own subprocess:
operations/s per phase (wall and CPU), peak and anonymous RSS, medians of ``--runs``.

    nice .venv/bin/python bench/budgets_bench.py micro --urls 200000 --domains 20000 --runs 3
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

RECORD = b"r" * 56
PARAMS = dict(base_budget=2, per_inlink=2, max_budget=100_000)


def stream(urls: int, domains: int, seed: int):
    """(domain index per URL, targets per page): Zipf-distributed, deterministic."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, domains + 1, dtype=np.float64)
    p = ranks ** -1.1
    p /= p.sum()
    dom = rng.choice(domains, size=urls, p=p)
    pages = urls // 10
    targets = rng.choice(domains, size=(pages, 8), p=p)
    return dom.tolist(), targets.tolist()


class DictPeer:
    """The rules of BEAST (one queue after another, budget per queue) on plain Python containers."""

    def __init__(self):
        self.edges: set[tuple[str, str]] = set()
        self.indeg: collections.Counter[str] = collections.Counter()
        self.spent: collections.Counter[str] = collections.Counter()
        self.deferred: dict[str, collections.deque] = {}

    def budget(self, d):
        return min(PARAMS["max_budget"], PARAMS["base_budget"] + PARAMS["per_inlink"] * self.indeg[d])

    def offer(self, d, rec):
        if d not in self.deferred and self.spent[d] < self.budget(d):
            self.spent[d] += 1
            return True
        self.deferred.setdefault(d, collections.deque()).append(rec)
        return False

    def add(self, src, targets):
        for t in set(targets):
            if t != src and (src, t) not in self.edges:
                self.edges.add((src, t))
                self.indeg[t] += 1

    def readmit(self, limit, advance=True):
        self.spent.clear()                 # the next queue
        out = []
        for d in list(self.deferred):
            q = self.deferred[d]
            n = min(self.budget(d), len(q), limit - len(out))
            for _ in range(n):
                out.append(q.popleft())
            self.spent[d] += n
            if not q:
                del self.deferred[d]
            if len(out) >= limit:
                break
        return out


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def run_one(store: str, urls: int, domains: int, seed: int) -> dict:
    dom, targets = stream(urls, domains, seed)
    names = [f"d{i}.example" for i in range(domains)]
    tmp = tempfile.mkdtemp(prefix="budgets-bench-")
    try:
        if store == "budgets":
            from crawlerd.frontier.budgets import Beast, BudgetRule, BudgetStore, DomainGraph, EdgeDrum
            st = BudgetStore(os.path.join(tmp, "state"), map_size_bytes=8 << 30, sync=False)
            g = DomainGraph(st, mode="all")
            b = Beast(st, g, BudgetRule(**PARAMS))
            e = EdgeDrum(os.path.join(tmp, "edges"), g)
            commit, poll, flush, add = st.commit, e.poll, e.flush, e.add
        else:
            b = e = DictPeer()
            add = e.add
            commit = poll = flush = lambda *a: None     # noqa: E731
        out = {}

        t0, c0 = time.perf_counter(), time.process_time()
        offer = b.offer
        for i, d in enumerate(dom):
            offer(names[d], RECORD)
            if i % 1000 == 999:
                commit()
        commit()
        out["intake"] = (urls, time.perf_counter() - t0, time.process_time() - c0)

        t0, c0 = time.perf_counter(), time.process_time()
        n_edges = 0
        for k, tg in enumerate(targets):
            add(names[dom[k * 10]], [names[t] for t in tg])
            n_edges += 8
            if k % 100 == 99:
                poll()
        flush()
        out["edges"] = (n_edges, time.perf_counter() - t0, time.process_time() - c0)

        t0, c0 = time.perf_counter(), time.process_time()
        got = 0
        while True:
            recs = b.readmit(1000, advance=True)
            commit()
            if not recs:
                break
            got += len(recs)
        out["readmit"] = (max(got, 1), time.perf_counter() - t0, time.process_time() - c0)
        out["readmitted"] = got
        if store == "budgets":
            st.close()
            e.close()
        out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out["anon_mib"] = _status_kib("RssAnon") / 1024    # heap now: RSS less mapped LMDB/DRUM file pages
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def micro_bench(a) -> int:
    if a.child:
        print(json.dumps(run_one(a.child, a.urls, a.domains, a.seed)))
        return 0
    results: dict[str, list[dict]] = {"budgets": [], "dict": []}
    for _ in range(a.runs):
        for store in results:          # interleaved, so both see the same machine load
            cmd = [sys.executable, os.path.abspath(__file__), "micro", "--child", store, "--urls", str(a.urls),
                   "--domains", str(a.domains), "--seed", str(a.seed)]
            results[store].append(json.loads(subprocess.check_output(cmd)))
    print(f"urls={a.urls} domains={a.domains} runs={a.runs} params={PARAMS}")
    print(f"{'phase':<9} {'store':<8} {'ops/s (wall)':>14} {'ops/s (cpu)':>13} {'dict/budgets':>13}")
    med = {}
    for phase in ("intake", "edges", "readmit"):
        for store, runs in results.items():
            wall = statistics.median(r[phase][0] / r[phase][1] for r in runs)
            cpu = statistics.median(r[phase][0] / max(r[phase][2], 1e-9) for r in runs)
            med[phase, store] = wall
            ratio = f"{wall / med[phase, 'budgets']:.2f}" if store == "dict" else ""
            print(f"{phase:<9} {store:<8} {wall:>14,.0f} {cpu:>13,.0f} {ratio:>13}")
    for store, runs in results.items():
        print(f"{store:<8} peak RSS {statistics.median(r['rss_mib'] for r in runs):.0f} MiB "
              f"(anonymous at the end {statistics.median(r['anon_mib'] for r in runs):.0f} MiB), "
              f"readmitted {runs[0]['readmitted']}")
    return 0


# --- the crawl benchmark: farm share, giants, one domain vs one domain per host, in-degree lag ---------

CRAWL_UA = "crawlerd-bench/0.1 (+synthetic web on loopback; operator: bench@localhost)"


def toml_value(v) -> str:
    """A TOML value for the few types a crawl config needs (JSON strings are TOML basic strings)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def write_config(path: str, data_dir: str, static_hosts: dict[str, str], sets: dict[str, dict]) -> None:
    """The crawl's config as a TOML file (20,000 static host names do not fit on a command line)."""
    conf = {"crawl": {"data_dir": data_dir, "user_agent": CRAWL_UA},
            "network": {"allow": ["127.0.0.0/8"]}, "log": {"level": "warning"},
            "dns": {"static_hosts": static_hosts}}
    for section, kv in sets.items():
        conf.setdefault(section, {}).update(kv)
    with open(path, "w") as f:
        for section, kv in conf.items():
            f.write(f"[{section}]\n")
            for k, v in kv.items():
                f.write(f"{k} = {toml_value(v)}\n")


def top_domains_of(site: dict, n: int) -> list[str]:
    """The ``n`` legitimate registered domains with the most pages (farm hosts excluded)."""
    from crawlerd.url.hosts import registered_domain
    pages: collections.Counter[str] = collections.Counter()
    for name, h in site["hosts"].items():
        if h["role"] != "farm":
            pages[registered_domain(name)] += h["pages"]
    return [d for d, _ in pages.most_common(n)]


def one_crawl(label: str, a, work: str, sim_args: list[str], sets: dict[str, dict]) -> dict:
    """One crawl of a fresh simweb for ``a.seconds``: what the server saw, and the daemon's own stats."""
    from crawlerd.simweb import SimWebProcess
    from crawlerd.url.hosts import registered_domain
    d = os.path.join(work, label)
    os.makedirs(d)
    data_dir = os.path.join(d, "data")
    with SimWebProcess(hosts=a.hosts, seed=a.seed, bind="0.0.0.0", extra_args=sim_args + ["--ledger-max", "0"],
                       stderr=subprocess.DEVNULL) as sim:
        site = sim.site()
        roots = [s for s in sim.seeds if site["hosts"][s.split("//", 1)[1].split(":", 1)[0]]["role"] != "giant"]
        seeds = random.Random(a.seed).sample(roots, min(a.seeds, len(roots)))
        seeds_path, conf = os.path.join(d, "seeds.txt"), os.path.join(d, "crawl.toml")
        with open(seeds_path, "w") as f:
            f.write("\n".join(seeds) + "\n")
        write_config(conf, data_dir, sim.static_hosts, sets)
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "crawlerd", "run", "--config", conf, "--seeds", seeds_path,
                                 "--duration", str(a.seconds)], stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(d, "crawlerd.stderr"), "w"), stdin=subprocess.DEVNULL)
        samples = []
        while proc.poll() is None and time.monotonic() - t0 < a.seconds + 120:
            time.sleep(10.0)
            r = subprocess.run([sys.executable, "-m", "crawlerd", "stats", "--json", "--config", conf],
                               capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                s = json.loads(r.stdout)
                g = (s.get("budgets") or {}).get("graph") or {}
                samples.append({"t": round(time.monotonic() - t0, 1), "pages": s["pages"],
                                "lag_last_s": g.get("lag_last_s"), "lag_max_s": g.get("lag_max_s"),
                                "oldest_waiting_s": g.get("oldest_waiting_s"),
                                "reader": (s.get("budgets") or {}).get("reader_queue"),
                                "deferred": (s.get("budgets") or {}).get("deferred_now"),
                                **{k: (s.get("frontier") or {}).get(k) for k in
                                   ("queued", "hosts_active", "hosts_ready", "hosts_ip_wait", "hosts_dns")}})
        try:
            proc.wait(timeout=max(1.0, a.seconds + 180 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        entries = sim.ledger()
    try:
        with open(os.path.join(data_dir, "last-run.json")) as f:
            last = json.load(f)
    except FileNotFoundError:
        with open(os.path.join(d, "crawlerd.stderr")) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"budgets_bench: {label}: crawlerd left no last-run.json (exit {proc.returncode}):\n{tail}") from None
    roles = {n: h["role"] for n, h in site["hosts"].items()}
    pages = [e for e in entries if e.target != "/robots.txt" and e.status and e.t_start - entries[0].t_start
             <= a.seconds] if entries else []
    by_pld = collections.Counter(registered_domain(e.host) for e in pages)
    farm = sum(1 for e in pages if roles.get(e.host) == "farm")
    tenths = [[0, 0] for _ in range(10)]          # (farm, all) fetches per tenth of the crawl
    for e in pages:
        t = tenths[min(9, int(10 * (e.t_start - entries[0].t_start) / a.seconds))]
        t[0] += roles.get(e.host) == "farm"
        t[1] += 1
    bu = last.get("budgets") or {}
    g = bu.get("graph") or {}
    return {"label": label, "pages": len(pages), "pages_per_s": len(pages) / a.seconds, "farm": farm,
            "farm_share": farm / max(len(pages), 1), "farm_tenths": tenths, "by_pld": dict(by_pld),
            "rc": proc.returncode,
            "top_domains": top_domains_of(site, 10), "samples": samples,
            "lag_max_s": g.get("lag_max_s"), "lag_last_s": g.get("lag_last_s"),
            "reader": bu.get("reader_queue"), "deferred_now": bu.get("deferred_now"),
            "readmitted": bu.get("readmitted"), "advances": bu.get("advances"), "probation": bu.get("probation"),
            "cpu_s": last.get("cpu_s"), "self_pages": last.get("pages"),
            "cpu_crawl_s": (last.get("cpu_by_process_s") or {}).get("crawl"),
            "cpu_workers_s": sum(v for k, v in (last.get("cpu_by_process_s") or {}).items() if k != "crawl")}


def crawl_bench(a) -> int:
    from crawlerd.simweb.netns import in_private_netns
    if not in_private_netns():
        if a.inside_netns:
            print("budgets_bench: not in a private network namespace after unshare; refusing", file=sys.stderr)
            return 2
        if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
            print("budgets_bench: needs root with unshare(1) and ip(8) for a private network namespace",
                  file=sys.stderr)
            return 2
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', sys.executable,
               os.path.abspath(__file__), *sys.argv[1:], "--inside-netns"]
        return subprocess.call(cmd)
    farm_args = ["--farm-domains", str(a.farm_domains), "--farm-hosts", str(a.farm_hosts),
                 "--farm-in-rate", str(a.farm_in_rate), "--giants", "10", "--giant-hosts", str(a.giant_hosts)]
    on, off = {}, {"budgets": {"enabled": False}}
    plans = {"farm_on": (farm_args, on), "farm_off": (farm_args, off),
             "one_domain": (["--one-domain", "uni.sim"], on), "per_host": ([], on)}
    only = set(a.only.split(",")) if a.only else set(plans)
    results: dict[str, list[dict]] = collections.defaultdict(list)
    work = tempfile.mkdtemp(prefix="budgets-crawl-")
    try:
        # the two crawls of a ratio run side by side (each on its own simweb), so that the noise of
        # a shared box hits both alike; one after the other, a load change between them decides
        for run in range(a.runs):
            for pair in (("farm_on", "farm_off"), ("one_domain", "per_host")):
                labels = [x for x in pair if x in only]
                with concurrent.futures.ThreadPoolExecutor(len(labels) or 1) as ex:
                    futs = {x: ex.submit(one_crawl, f"{x}-{run}", a, work, *plans[x]) for x in labels}
                    for label in labels:
                        r = futs[label].result()
                        results[label].append(r)
                        print(f"# {label} run {run}: pages {r['pages']} ({r['pages_per_s']:.1f}/s) farm {r['farm']} "
                              f"({r['farm_share']:.4%}) reader {r['reader']} (advances {r['advances']}, probation "
                              f"{r['probation']}) lag max {r['lag_max_s']} "
                              f"rc {r['rc']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    print(f"\nhosts={a.hosts} seeds={a.seeds} seconds={a.seconds} runs={a.runs} farm={a.farm_domains}x{a.farm_hosts} "
          f"in_rate={a.farm_in_rate} giants=10x{a.giant_hosts}  (medians over runs)")
    if results.get("farm_on") and results.get("farm_off"):
        fon, foff = results["farm_on"], results["farm_off"]
        print(f"farm share of fetches     on {med(r['farm_share'] for r in fon):.4%}   "
              f"off {med(r['farm_share'] for r in foff):.4%}   (bound 0.5%)")
        tops = fon[0]["top_domains"]
        ratios = [sum(r["by_pld"].get(d, 0) for d in tops) / max(1, sum(o["by_pld"].get(d, 0) for d in tops))
                  for r, o in zip(fon, foff, strict=False)]
        worst = [min(r["by_pld"].get(d, 0) / max(1, o["by_pld"].get(d, 0)) for d in tops)
                 for r, o in zip(fon, foff, strict=False)]
        print(f"ten largest legit domains on/off fetches {med(ratios):.3f} (worst domain {med(worst):.3f}; "
              f"bound 0.90)   pages/s on {med(r['pages_per_s'] for r in fon):.1f} "
              f"off {med(r['pages_per_s'] for r in foff):.1f}")
        print("farm fetches / all per tenth of the crawl (on): "
              + " ".join(f"{f}/{n}" for f, n in fon[0]["farm_tenths"]))
        print(f"in-degree lag (farm, on)  max {med(r['lag_max_s'] or 0 for r in fon):.1f} s; samples: "
              + ", ".join(f"{s['t']:.0f}s:{s['lag_last_s']}" for s in fon[0]["samples"][::6]))
    if results.get("one_domain") and results.get("per_host"):
        one, per = results["one_domain"], results["per_host"]
        ratio = [o["pages_per_s"] / max(p["pages_per_s"], 1e-9) for o, p in zip(one, per, strict=False)]
        print(f"one domain / one per host pages/s {med(ratio):.3f} (bound 0.90): "
              f"{med(r['pages_per_s'] for r in one):.1f} vs {med(r['pages_per_s'] for r in per):.1f}; "
              f"reader on queue {one[0]['reader']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({k: [{kk: vv for kk, vv in r.items() if kk != "by_pld"} | {"top": {d: r["by_pld"].get(d, 0)
                       for d in r["top_domains"]}} for r in v] for k, v in results.items()}, f, indent=1)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("micro", help="the budget parts on a crawl-shaped stream, against Python containers")
    m.add_argument("--urls", type=int, default=200_000)
    m.add_argument("--domains", type=int, default=20_000)
    m.add_argument("--runs", type=int, default=3)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--child", help=argparse.SUPPRESS)
    c = sub.add_parser("crawl", help="whole crawls of simweb with a link farm and with one domain for all hosts")
    c.add_argument("--hosts", type=int, default=20_000)
    c.add_argument("--seeds", type=int, default=3_000)
    c.add_argument("--seconds", type=float, default=600.0)
    c.add_argument("--runs", type=int, default=1)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--farm-domains", type=int, default=200)
    c.add_argument("--farm-hosts", type=int, default=3)
    c.add_argument("--farm-in-rate", type=float, default=0.002)
    c.add_argument("--giant-hosts", type=int, default=20)
    c.add_argument("--only", default="", help="comma-separated crawls: farm_on,farm_off,one_domain,per_host")
    c.add_argument("--json", default="", help="write the per-crawl results here")
    c.add_argument("--inside-netns", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(sys.argv[1:] or ["micro"])        # `make bench` runs it bare: the bounded micro mode
    return micro_bench(a) if a.mode == "micro" else crawl_bench(a)


if __name__ == "__main__":
    raise SystemExit(main())
