"""bench/e2e_bench.py's summary over runs (medians; violations summed) and the tables it prints."""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from typing import TYPE_CHECKING

from crawlerd.simweb.ledger import HOST_GAP, HOST_OVERLAP, IP_CONCURRENCY

if TYPE_CHECKING:
    from e2e_bench import CrawlResult


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
        "refetches": sum(r.judged["refetches"] for r in results),
        "refetch_share": _median([r.judged["refetch_share"] for r in results]),
        "steady": {k: _median([r.steady.get(k) for r in results])
                   for k in ("pages_per_s", "crawl_us_per_request", "crawl_us_per_page", "workers_us_per_page",
                             "all_us_per_page", "simweb_us_per_request", "stall_p99_ms", "stall_p999_ms",
                             "stall_max_ms_whole_run", "own_stall_p999_ms", "stall_over_20ms_per_min",
                             "stall_over_50ms_per_min", "stall_over_100ms_per_min", "own_stall_over_20ms_per_min",
                             "own_stall_over_50ms_per_min", "own_stall_over_100ms_per_min")},
        "in_flight_median": _median([(r.steady.get("in_flight") or {}).get("median") for r in results]),
        "hosts_paged": _median([r.judged.get("hosts_paged") for r in results]),
        "connections_new": _median([(r.extra.get("connections") or {}).get("new") for r in results]),
        "connections_reused": _median([(r.extra.get("connections") or {}).get("reused") for r in results]),
        "in_flight_max": _median([(r.steady.get("in_flight") or {}).get("max") for r in results]),
    }


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def print_table(summary: dict[str, dict], runs: int, hosts: int, seconds: float) -> None:
    print(f"\n=== end-to-end: {hosts} hosts, {seconds:g} s per crawl, "
          f"{runs} run(s): medians; violations summed over runs ===")
    head = (f"{'crawler':15} {'pages':>6} {'window':>6} {'pages/s':>7} {'self/s':>6} {'CPU ms/pg':>9}  "
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
        print(f"{name:15} {_f(s['pages'], '6.0f')} {_f(s['pages_in_window'], '6.0f')} "
              f"{_f(s['pages_per_s'], '7.1f')} {_f(s['self_pages_per_s'], '6.1f')} "
              f"{_f(s['cpu_ms_per_page'], '9.2f')}  {by:24} {_f(s['simweb_cpu_ms_per_page'], '12.2f')} "
              f"{_f(s['peak_rss_mib'], '6.0f')}Mi {polite:>20} {sum(s['robots'].values()):6d} "
              f"{s['retry_after']:9d} {warc:>4}")
    for scheme in ("http", "https"):
        c, p = summary.get(f"crawlerd/{scheme}"), summary.get(f"scrapy/{scheme}")
        if c and p and c["pages_per_s"] and p["pages_per_s"] and c["cpu_ms_per_page"] and p["cpu_ms_per_page"]:
            print(f"\n{scheme}: crawlerd / scrapy: pages/s x{c['pages_per_s'] / p['pages_per_s']:.2f}, "
                  f"CPU per page x{c['cpu_ms_per_page'] / p['cpu_ms_per_page']:.2f}, "
                  f"peak RSS x{c['peak_rss_mib'] / p['peak_rss_mib']:.2f}")
    print("\npages: answered non-robots requests in the server ledger over the whole run; window: those that "
          "started\nwithin D s of launch; pages/s = window / D; self/s: the crawler's own count / its own wall "
          "time;\nCPU per page = CPU of the whole run / pages; polite viol: o = host overlap, g = host gap < "
          "max(1 s, Crawl-delay),\nip = more than 1 request in flight per IP")
    for name, s in summary.items():
        print(f"{name}: robots violations by kind {s['robots'] or '{}'}; exit codes {s['exit_codes']}")
    print_steady(summary)


def print_steady(summary: dict[str, dict]) -> None:
    """The steady-state table (after warm-up): per-process CPU, stalls, in flight, refetches."""
    print("\n=== steady state (after warm-up): medians ===")
    head = (f"{'crawler':16} {'pages/s':>7} {'crawl us/req':>12} {'crawl us/pg':>11} {'workers us/pg':>13} "
            f"{'all us/pg':>9} {'simweb us/req':>13} {'stall p99.9':>11} {'own p99.9':>9} {'in flight med/max':>17} "
            f"{'refetch':>8}")
    print(head)
    print("-" * len(head))
    for name, s in summary.items():
        st = s["steady"]
        infl = "-" if s["in_flight_median"] is None else f"{s['in_flight_median']:.0f}/{s['in_flight_max']:.0f}"
        p999, own = st.get("stall_p999_ms"), st.get("own_stall_p999_ms")
        print(f"{name:16} {_f(st['pages_per_s'], '7.1f')} {_f(st['crawl_us_per_request'], '12.0f')} "
              f"{_f(st['crawl_us_per_page'], '11.0f')} {_f(st['workers_us_per_page'], '13.0f')} "
              f"{_f(st['all_us_per_page'], '9.0f')} {_f(st['simweb_us_per_request'], '13.0f')} "
              f"{'-' if p999 is None else f'{p999:g} ms':>11} {'-' if own is None else f'{own:g} ms':>9} {infl:>17} "
              f"{_f(100 * (s['refetch_share'] or 0), '7.2f')}%")
    for scheme in ("http", "https"):
        c, p = summary.get(f"crawlerd/{scheme}"), summary.get(f"scrapy/{scheme}")
        if c and p and c["steady"]["pages_per_s"] and p["steady"]["pages_per_s"]:
            print(f"{scheme}: crawlerd / scrapy steady pages/s x{c['steady']['pages_per_s'] / p['steady']['pages_per_s']:.1f}")
    h, t = summary.get("crawlerd/http"), summary.get("crawlerd/https")
    if h and t and h["steady"]["all_us_per_page"] and t["steady"]["all_us_per_page"]:
        print(f"crawlerd https / http CPU per page x{t['steady']['all_us_per_page'] / h['steady']['all_us_per_page']:.2f}")


def print_stalls(st: dict) -> None:
    """One crawl's loop stalls over the steady window: the wall lag and the loop's own lag (less the
    time its thread waited for a CPU), samples later than 20 / 50 / 100 ms per minute, the split of
    the samples over 20 ms, and the collector's passes."""
    for prefix, name in (("stall", "stall"), ("own_stall", "own stall (less CPU wait)")):
        if f"{prefix}_p999_ms" in st:
            per_min = " / ".join(_f(st.get(f"{prefix}_over_{b}ms_per_min"), ".1f") for b in (20, 50, 100))
            print(f"    {name}: p99 {st.get(f'{prefix}_p99_ms')} ms, p99.9 {st.get(f'{prefix}_p999_ms')} ms, "
                  f"samples > 20 / 50 / 100 ms per minute: {per_min}", file=sys.stderr)
    sp = st.get("stall_split")
    if sp:
        print(f"    samples > 20 ms: {sp['count']:.0f}, lag {sp['lag_s'] * 1000:.0f} ms in all: loop thread CPU "
              f"{sp['cpu_s'] * 1000:.0f} ms, waiting for a CPU {sp['runq_s'] * 1000:.0f} ms, GC {sp['gc_s'] * 1000:.0f} ms",
              file=sys.stderr)
    for g, v in (st.get("gc") or {}).items():
        n, over = v["collections"], v.get("over_20ms")
        mean = f", mean {v['total_ms'] / n:.1f} ms" if n else ""
        print(f"    {g}: {n} collections, {v['total_ms']} ms{mean}, "
              f"{'?' if over is None else over} over 20 ms (worst of the run {v['max_ms_whole_run']} ms)",
              file=sys.stderr)
