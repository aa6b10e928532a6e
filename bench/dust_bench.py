"""DUST benchmark: duplicate URL variants fetched with the rule learner off and on, on one synthetic web.

    nice -n 10 .venv/bin/python bench/dust_bench.py [--hosts 2000] [--seconds 120] [--variants 0.5]
    nice -n 10 .venv/bin/python bench/dust_bench.py --hosts 2000 --seconds 600       # the recorded run
    nice -n 10 .venv/bin/python bench/dust_bench.py --hosts 2000 --seconds 240 --only on --keep   # diagnostics

Re-runs itself under ``unshare -n`` (only ``lo``). For each crawl a fresh simweb with the same seed
serves ``--hosts`` hosts, a share ``--variants`` of the ordinary ones with URL variants of their
pages (``crawlerd.simweb.variants``: tracking parameters, sort orders, print/mobile views and
session ids that do not change the page, page numbers and languages that do), names resolved by
simweb's DNS. crawlerd crawls it for ``--seconds`` twice in one run, with ``dust.enabled = false``
and with the learner on, both at the same time (each against its own simweb), so that a shared,
noisy machine treats them alike; ``--sequential`` runs them one after the other instead.

Judged from simweb's server ledger and site description, never from the crawler's word:

* **duplicate share**: 200 answers to page targets whose page (``variants.content_key``) had
  already been fetched under another URL, over all 200 answers to non-robots requests;
  by the kind of the variant fetched again, per tenth of the crawl by kind and by why it was
  fetched (a sample, a probe, a suspect leased from the deferred level, or admitted: from the
  learner's ``dust_sample``, ``dust_probe`` and ``dust_suspect_fetched`` events);
* **pages**: distinct pages fetched (the same oracle; other targets count by URL);
* **false skips**: URLs the crawler's event log says it skipped (``dust_skipped``) whose page
  was never fetched under any URL (a unique page lost): must be 0;
* the learner's own account (rules trusted, retired, sample mismatches, skips, probes) from
  ``last-run.json``; politeness from the ledger, as a sanity check.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter, defaultdict

import e2e_bench as E

from crawlerd.simweb import SimWebProcess
from crawlerd.simweb.netns import in_private_netns
from crawlerd.simweb.variants import content_key


def page_key(hosts: dict, host: str, target: str) -> str:
    """The page a target shows: the variant oracle on hosts with variants; elsewhere /p/ pages
    ignore their query (simweb serves them whatever it is) and anything else is its own page."""
    h = hosts.get(host)
    if h is None:
        return target
    if h.get("variants"):
        return content_key(h, target) or target
    path = target.partition("?")[0]
    return path if path.startswith("/p/") else target


def variant_kind(target: str) -> str:
    path, _, query = target.partition("?")
    names = {x.partition("=")[0] for x in query.split("&")} if query else set()
    if path.startswith("/m/"):
        return "mobile"
    if ";jsessionid=" in path or "sid" in names:
        return "session"
    if names & {"utm_source", "ref", "fbclid"}:
        return "tracking"
    if "sort" in names:
        return "sort"
    if "view" in names:
        return "print"
    return "canonical"


def read_events(data_dir: str, kind: str) -> list[dict]:
    out = []
    for path in sorted(glob.glob(os.path.join(data_dir, "events", "*.jsonl*"))):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("kind") == kind:
                    out.append(ev)
    return out


def url_key(url: str) -> tuple[str, str]:
    """(host, target) of an absolute URL from the event log."""
    netloc, _slash, tail = url.split("://", 1)[1].partition("/")
    return (netloc.rsplit(":", 1)[0] if ":" in netloc else netloc), "/" + tail


def judge(entries, site: dict, skipped: list[dict], samples: list[dict] | None = None,
          probes: list[dict] | None = None, suspects: list[dict] | None = None) -> dict:
    hosts = site["hosts"]
    rpaths = E.robots_paths(site)
    pages = sorted((e for e in entries if e.status == 200 and e.path not in rpaths.get(e.host, ())),
                   key=lambda e: e.seq)
    first: dict[tuple[str, str], str] = {}
    groups: dict[tuple[str, str], set[str]] = defaultdict(set)
    dup_kinds: Counter[str] = Counter()
    dup_first: Counter[str] = Counter()         # the kind of the URL the page was first fetched under
    dup_tenth: Counter[int] = Counter()         # when, in tenths of the crawl's 200 answers
    # why the crawler fetched it: a sample of a trusted rule, a probe, a suspect leased from the
    # deferred level ("deferred": its host had nothing else), or none of those ("admitted")
    sampled = {url_key(ev["url"]) for ev in samples or ()}
    probed = {url_key(ev["url"]) for ev in probes or ()}
    deferred = {url_key(ev["url"]) for ev in suspects or ()}
    why_tenth: dict[str, Counter[int]] = defaultdict(Counter)
    kind_tenth: dict[str, Counter[int]] = defaultdict(Counter)
    admitted_examples: list[str] = []
    seq0, seq1 = (pages[0].seq, pages[-1].seq) if pages else (0, 1)
    dups = 0
    for e in pages:
        h = hosts.get(e.host)
        if not h or not h.get("variants"):
            continue
        key = content_key(h, e.target)
        if key is None:
            continue
        g = (e.host, key)
        if g in first and e.target not in groups[g]:
            dups += 1
            dup_kinds[variant_kind(e.target)] += 1
            dup_first[variant_kind(first[g])] += 1
            tenth = min(9, 10 * (e.seq - seq0) // max(1, seq1 - seq0))
            dup_tenth[tenth] += 1
            why = "sample" if (e.host, e.target) in sampled else "probe" if (e.host, e.target) in probed \
                else "deferred" if (e.host, e.target) in deferred else "admitted"
            why_tenth[why][tenth] += 1
            kind_tenth[variant_kind(e.target)][tenth] += 1
            if why == "admitted" and len(admitted_examples) < 40:
                admitted_examples.append(f"{tenth} {e.host}{e.target} (first {first[g]})")
        first.setdefault(g, e.target)
        groups[g].add(e.target)
    fetched = {(e.host, page_key(hosts, e.host, e.target)) for e in pages}
    false_skips = []
    for ev in skipped:
        url = ev["url"]
        host, target = url_key(url)
        if (host, page_key(hosts, host, target)) not in fetched:
            false_skips.append(url)
    n = len(pages)
    return {"pages_200": n, "variant_dups": dups, "dup_share": dups / n if n else 0.0,
            "dup_by_kind": dict(dup_kinds), "dup_by_first_kind": dict(dup_first),
            "dup_by_tenth": [dup_tenth[i] for i in range(10)],
            "dup_why_by_tenth": {w: [c[i] for i in range(10)] for w, c in sorted(why_tenth.items())},
            "dup_kind_by_tenth": {w: [c[i] for i in range(10)] for w, c in sorted(kind_tenth.items())},
            "admitted_dup_examples": admitted_examples, "distinct_pages": len(fetched),
            "variant_hosts_fetched": len({h for h, _ in groups}), "skipped_events": len(skipped),
            "false_skips": len(false_skips), "false_skip_examples": false_skips[:5]}


STOP_GRACE_S = 90.0     # after D, the crawler's own ordered shutdown (a loaded 2-core box needs ~25 s)


def one_crawl(label: str, args, root: str, sets: list[str]) -> dict:
    work = os.path.join(root, label)
    os.makedirs(work)
    with SimWebProcess(hosts=args.hosts, seed=args.seed, bind="0.0.0.0", dns_port=0,
                       extra_args=["--variants", str(args.variants), "--ledger-max", "0"]) as sim:
        seeds = os.path.join(work, "seeds.txt")
        with open(seeds, "w") as f:
            f.write("\n".join(sim.seeds[:args.seeds] if args.seeds else sim.seeds) + "\n")
        E.STOP_GRACE_S = STOP_GRACE_S
        run = argparse.Namespace(seconds=args.seconds, warmup=min(30.0, args.seconds / 4),
                                 crawlerd_python=sys.executable, py_spy=None)
        r = E.run_crawlerd(sim, seeds, run, work, sets + list(args.set or []), label)
        entries, site = sim.ledger(), sim.site()
    data_dir = os.path.join(work, "crawlerd-data")
    j = judge(entries, site, read_events(data_dir, "dust_skipped"), read_events(data_dir, "dust_sample"),
              read_events(data_dir, "dust_probe"), read_events(data_dir, "dust_suspect_fetched"))
    last = {}
    try:
        with open(os.path.join(data_dir, "last-run.json")) as f:
            last = json.load(f)
    except (OSError, ValueError):
        pass
    dust = last.get("dust", {})
    rules = read_events(data_dir, "dust_rule")
    return {"label": label, "rc": r.rc, "judged": j, "politeness": r.judged["politeness"],
            "robots": r.judged["robots"], "self_pages_per_s": r.self_pages_per_s,
            "cpu_ms_per_page": 1000 * r.cpu_total_s / j["pages_200"] if j["pages_200"] else None,
            # the crawl process's CPU per request answered (robots.txt included: the same fixed cost in both)
            "crawl_cpu_ms_per_request": (1000 * r.cpu_by_process_s.get("crawl", 0.0) / r.judged["requests"]
                                         if r.judged["requests"] else None),
            "dust": {k: v for k, v in dust.items() if k != "top"}, "top_rules": dust.get("top", [])[:10],
            "rule_events": Counter(ev["outcome"] for ev in rules),
            "stderr_tail": r.extra.get("stderr_tail", "")}


def print_report(res: list[dict], args) -> None:
    print(f"\n=== DUST: {args.hosts} hosts ({args.variants:g} of ordinary hosts with URL variants), "
          f"{args.seconds:g} s per crawl, seed {args.seed} ===")
    head = f"{'learner':8} {'200 pages':>9} {'dups':>6} {'dup share':>9} {'pages':>8} {'skipped':>8} " \
           f"{'false skips':>11} {'trusted':>7} {'retired':>7} {'mismatch':>8} {'polite viol':>11} {'crawl ms/req':>12}"
    print(head)
    print("-" * len(head))
    for r in res:
        j, d = r["judged"], r["dust"]
        print(f"{r['label']:8} {j['pages_200']:9d} {j['variant_dups']:6d} {100 * j['dup_share']:8.2f}% "
              f"{j['distinct_pages']:8d} {j['skipped_events']:8d} {j['false_skips']:11d} "
              f"{d.get('rules_learned_total', 0):7d} {d.get('rules_retired_total', 0):7d} "
              f"{d.get('sample_mismatches_total', 0):8d} {sum(r['politeness'].values()):11d} "
              f"{r['crawl_cpu_ms_per_request'] or 0:12.2f}")
    for r in res:
        print(f"{r['label']}: duplicates by kind {r['judged']['dup_by_kind']}, by the kind first fetched "
              f"{r['judged']['dup_by_first_kind']}, by tenth of the crawl {r['judged']['dup_by_tenth']}; "
              f"learner {r['dust']}")
        for name, rows in (("why fetched", r["judged"]["dup_why_by_tenth"]),
                           ("kind", r["judged"]["dup_kind_by_tenth"])):
            for w, row in rows.items():
                print(f"  dups per tenth, {name} {w:9}: {row}")
        if r["judged"]["false_skip_examples"]:
            print(f"  false skips, e.g. {r['judged']['false_skip_examples']}")
    on = [r for r in res if r["label"] == "on"]
    if on and on[0]["top_rules"]:
        print("top rules (learner on):")
        for h in on[0]["top_rules"][:5]:
            print(f"  {h['host']}: " + "; ".join(f"{x['rule']} {x['state']} conf {x['confirmations']} "
                                                f"skips {x['skips']}" for x in h["rules"][:4]))
    print("dups: 200 answers for a page already fetched under another URL (the variant oracle); share of all "
          "200 answers;\npages: distinct pages fetched; false skips: skipped URLs whose page was never fetched")


def bench(args) -> dict:
    root = tempfile.mkdtemp(prefix="crawlerd-dust-")
    order = ["off", "on"] if args.order == "off-first" else ["on", "off"]
    if args.only:
        order = [args.only]
    res: list[dict] = []
    errors: list[BaseException] = []

    def crawl(label: str) -> None:
        print(f"crawl with the learner {label}: {args.hosts} hosts, {args.seconds:g} s ...", file=sys.stderr,
              flush=True)
        try:
            r = one_crawl(label, args, root, [f"dust.enabled={'true' if label == 'on' else 'false'}"])
        except BaseException as e:          # reported after both crawls
            errors.append(e)
            return
        j = r["judged"]
        print(f"  {label}: {j['pages_200']} pages, {j['variant_dups']} dups ({100 * j['dup_share']:.2f}%), "
              f"false skips {j['false_skips']}, exit {r['rc']}", file=sys.stderr, flush=True)
        if r["stderr_tail"]:
            print(r["stderr_tail"], file=sys.stderr)
        res.append(r)
    try:
        if args.sequential:
            for label in order:
                crawl(label)
        else:
            threads = [threading.Thread(target=crawl, args=(label,)) for label in order]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
    finally:
        if args.keep:
            print(f"kept work dir {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    res.sort(key=lambda r: r["label"] != "off")
    print_report(res, args)
    out = {"hosts": args.hosts, "seconds": args.seconds, "variants": args.variants, "seed": args.seed,
           "seeds": args.seeds, "concurrent": not args.sequential, "code": E.code_version(), "results": res}
    print(f"code: {out['code']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hosts", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=120.0, help="per crawl")
    p.add_argument("--variants", type=float, default=0.5, help="share of ordinary hosts with URL variants")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", type=int, default=0, help="seed only the first N hosts' roots (0: all)")
    p.add_argument("--order", choices=("off-first", "on-first"), default="off-first",
                   help="which crawl starts (or runs) first")
    p.add_argument("--only", choices=("off", "on"), help="one crawl only (diagnostics; no side-by-side ratio)")
    p.add_argument("--sequential", action="store_true", help="one crawl after the other, not both at once")
    p.add_argument("-s", "--set", action="append", metavar="SECTION.KEY=VALUE", help="extra crawlerd override")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--keep", action="store_true", help="keep the work dir (data dirs, ledgers)")
    p.add_argument("--inside-netns", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.hosts < 1 or args.seconds <= 0 or not 0 <= args.variants <= 1:
        print("dust_bench: need --hosts >= 1, --seconds > 0, 0 <= --variants <= 1", file=sys.stderr)
        return 2
    if not in_private_netns():
        if args.inside_netns:
            print("dust_bench: not in a private network namespace after unshare; refusing to run", file=sys.stderr)
            return 2
        if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
            print("dust_bench: needs root with unshare(1) and ip(8) for a private network namespace", file=sys.stderr)
            return 2
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
               sys.executable, os.path.abspath(__file__), *argv, "--inside-netns"]
        return subprocess.call(cmd)
    bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
