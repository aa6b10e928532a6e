"""The operator's text views of ``crawlerd status`` and ``crawlerd stats`` (the JSON is the daemon's own).

Each function prints one view of an answer from the control socket; the CLI asks, these format.
"""

from __future__ import annotations

from crawlerd.metrics import LAG_BUCKETS_S, lag_quantile_s

STALL_SITES_SHOWN = 3       # `crawlerd status`: the most frequent places of loop stalls

def fmt_counts(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])) or "-"


def print_status(s: dict) -> None:
    """``crawlerd status``: the family's line, its shards, and each shard's loop lag."""
    print(f"crawlerd  {s['state']}  pid {s['pid']}  up {s['uptime_s']:.0f}s  data {s['data_dir']}")
    print(f"pages     {s['pages']}  ({s['pages_per_s_10s']:.1f}/s 10s, {s['pages_per_s_60s']:.1f}/s 60s)")
    print(f"queued    {s['queued']} URLs  {s['hosts_active']} hosts active  {s['in_flight']} in flight")
    print(f"working   {s.get('working_set_hosts', 0)} hosts leased from  {s.get('sessions_started', 0)} sessions started")
    print(f"outcomes  {fmt_counts(s['outcomes'])}")
    print(f"statuses  {fmt_counts(s['statuses'])}")
    if len(s.get("shards", [])) > 1:
        for sh in s["shards"]:
            ho = sh.get("handoff", {})
            waiting = sum(v.get("batches", 0) for v in ho.get("out", {}).values())
            print(f"shard {sh['shard']:<3} {sh['state']:<9} pid {sh['pid']}  {sh['pages']} pages  "
                  f"{sh['pages_per_s_10s']:.1f}/s  {sh['queued']} queued  {sh['in_flight']} in flight  "
                  f"restarts {sh['restarts']}  hand-off out {waiting} batches, in {ho.get('in_batches', 0)}")
    for sh in s.get("shards", []):
        ll = sh.get("loop_lag") or {}
        if ll.get("count"):
            bounds = ll.get("buckets_s") or LAG_BUCKETS_S
            p99, p999 = (lag_quantile_s(ll["cumulative"], ll["count"], q, bounds) for q in (0.99, 0.999))
            own = ""
            if ll.get("own_cumulative"):     # less the time the loop waited for a CPU
                own = f"  own p99.9 <= {lag_quantile_s(ll['own_cumulative'], ll['count'], 0.999, bounds) * 1000:g} ms"
            print(f"loop      shard {sh.get('shard')} lag p99 <= {p99 * 1000:g} ms  p99.9 <= {p999 * 1000:g} ms  "
                  f"max {ll['max_s'] * 1000:.1f} ms{own}")
            for site in (ll.get("stall_sites") or [])[:STALL_SITES_SHOWN]:     # where stalls over the watch threshold (20 ms) were
                print(f"          stalled x{site['stalls']} (worst {site['worst_s'] * 1000:.0f} ms) in {site['where']}")


def print_stats(s: dict) -> None:
    """``crawlerd stats``: counts, frontier, budgets, top hosts, DUST rules, memory, recent errors."""
    print(f"state {s['state']}  up {s['uptime_s']:.0f}s  pages {s['pages']}  "
          f"{s['pages_per_s_10s']:.1f}/s (10s)  {s['pages_per_s_60s']:.1f}/s (60s)  cpu {s['cpu_s']}s")
    print(f"queued {s['queued']}  hosts active {s['hosts_active']}  in flight {s['in_flight']}  "
          f"bytes {s['bytes']}")
    print("fetch outcomes: " + fmt_counts(s["outcomes"]))
    print("HTTP statuses:  " + fmt_counts(s["statuses"]))
    print("dropped:        " + fmt_counts(s["dropped"]))
    print("counters:       " + fmt_counts(s["counters"]))
    fr = s.get("frontier", {})
    if fr:
        print("frontier:       " + ", ".join(f"{k} {v}" for k, v in sorted(fr.items())
                                              if not isinstance(v, dict)))
    print_budgets(s.get("budgets") or {})
    print("top hosts:      " + ", ".join(f"{h} {n}" for h, n in s["top_hosts"][:10]))
    print_dust(s.get("dust") or {})
    print_memory(s)
    for e in s.get("recent_errors", []):
        print("recent error:   " + e)


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f}"


def print_memory(s: dict) -> None:
    """RAM by bounded component (estimated bytes held / cap, MiB) and resident memory by process and kind."""
    mem = s.get("memory") or {}
    if mem:
        print("memory (MiB held/cap): " + ", ".join(
            f"{k} {_mib(v.get('bytes', 0))}/{_mib(v.get('cap_bytes', 0))}" for k, v in sorted(mem.items())))
    bp = s.get("body_pool_fallbacks") or {}
    if bp:
        pm = mem.get("body_pool") or {}
        print(f"body pool:      {bp.get('pooled', 0)} bodies pooled, {bp.get('fetched', 0)} fell back to the heap, "
              f"{bp.get('inline', 0)} sent to a worker inline (pool full); in use {_mib(pm.get('bytes'))} MiB, "
              f"high-water {_mib(pm.get('high_water_bytes'))} MiB of {_mib(pm.get('cap_bytes'))} MiB")
    ni = s.get("near_index") or {}
    if ni:
        print(f"near index:     {ni.get('pairs', 0)} pages, {ni.get('disk_runs', 0)} run files, "
              f"{_mib(ni.get('disk_bytes', 0))} MiB on disk, {ni.get('stalls', 0)} stalls")
    for p in s.get("processes") or []:
        if p.get("rss_anon_bytes") is not None:
            print(f"rss {p['role']} {p['pid']}: anon {_mib(p['rss_anon_bytes'])} MiB, "
                  f"file-backed {_mib(p['rss_file_bytes'])} MiB, shmem {_mib(p['rss_shmem_bytes'])} MiB")


def print_dust(du: dict) -> None:
    """The DUST rules part of `crawlerd stats`: totals, then the top rules of the top hosts."""
    if not du.get("enabled"):
        return
    print(f"dust rules:     {du.get('rules_trusted', 0)} trusted on {du.get('hosts_with_rules', 0)} hosts; "
          f"learned {du.get('rules_learned_total', 0)}, retired {du.get('rules_retired_total', 0)}, "
          f"sample mismatches {du.get('sample_mismatches_total', 0)}, skipped {du.get('skipped_total', 0)} "
          f"(this run: deferred {du.get('deferred', 0)}, probes {du.get('probes', 0)}, "
          f"samples {du.get('samples', 0)})")
    pri = [p for p in du.get("priors", []) if p["active"]]
    if du.get("priors_active"):
        print(f"dust priors:    {du['priors_active']} active, adopted {du.get('priors_adopted_total', 0)} times: "
              + ", ".join(f"{p['rule']} ({p['hosts']} hosts, {p['counter_hosts']} against)" for p in pri[:6]))
    for h in du.get("top", []):
        print(f"  {h['host']}")
        for r in h["rules"]:
            state = r["state"] + ("*" if r.get("prior") else "")     # * trusted as a cross-host prior
            print(f"    {r['rule']:<32} {state:<9} confirmations {r['confirmations']:<4} "
                  f"skips {r['skips']:<6} samples {r['samples']:<4} sample mismatches {r['sample_mismatches']}")
def print_budgets(bu: dict) -> None:
    """The STAR/BEAST lines of ``crawlerd stats``: the reader, the graph, the top domains."""
    if not bu:
        return
    print(f"budgets:        reader on BEAST queue {bu['reader_queue']} ({bu['wraps']} wrap-arounds), "
          f"{bu['deferred_now']} URLs deferred in {bu['domains_waiting']} domains; admitted {bu['admitted']}, "
          f"deferred {bu['deferred']}, readmitted {bu['readmitted']}, refunded {bu['refunded']}; "
          f"budget = min({bu['max_budget']}, {bu['base_budget']} + {bu['per_inlink']} x in-degree) per queue")
    g = bu.get("graph") or {}
    if g:
        print(f"domain graph:   {g['edges_unique']} domain edges, {g['vouches']} counted ({g['mode']}), "
              f"{g['votes_waiting']} waiting for a voucher; {g['pending']} unmerged, oldest "
              f"{g['oldest_waiting_s']} s; in-degree lag {g['lag_last_s']} s (max {g['lag_max_s']} s)")
    tops = bu.get("top_domains") or []
    if tops:
        print(f"  {'domain':<40} {'in-degree':>9} {'budget':>8} {'spent':>7} {'deferred':>9} {'queue':>8}")
        for t in tops[:15]:
            queue = "-" if t["queue"] is None else str(t["queue"])
            print(f"  {t['domain'][:40]:<40} {t['indegree']:>9} {t['budget']:>8} {t['spent']:>7} "
                  f"{t['deferred']:>9} {queue:>8}")
