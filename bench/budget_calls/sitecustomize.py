"""Bench only: record every call the crawl makes into its budget stage, for ``bench/budgets_replay_bench.py``.

Loaded by Python at start when this directory is on ``PYTHONPATH`` (by its absolute path: the crawl
process starts in another directory) and ``CRAWLERD_BUDGET_RECORD`` is set (a path prefix); does
nothing otherwise. It wraps ``Budgets.offer_many``, ``offer``, ``readmit``, ``commit``,
``record_pages_links``, ``add_root``, ``refund`` and ``DomainGraph.apply`` (the edge answers) and
appends each call, with its arguments and what it returned, to ``<prefix>.<pid>.pkl`` (one pickle
per call; written at exit, so stop the crawl with SIGTERM).

    CRAWLERD_BUDGET_RECORD=/tmp/rec/r PYTHONPATH=$PWD/bench/budget_calls unshare -n sh -c 'ip link set lo up;
      .venv/bin/python bench/e2e_bench.py --hosts 20000 --seeds 3000 --seconds 45 --runs 1 --schemes http
      --no-peer --json /tmp/rec/run.json'
"""

import os

_OUT = os.environ.get("CRAWLERD_BUDGET_RECORD")


def _install(prefix: str) -> None:
    import atexit
    import pickle

    from crawlerd.frontier.budgets import graph, stage

    f = open(f"{prefix}.{os.getpid()}.pkl", "wb", buffering=1 << 20)    # noqa: SIM115 (closed at exit)
    atexit.register(f.close)

    def rec(x):
        pickle.dump(x, f, protocol=5)

    B = stage.Budgets
    om, o, rm, c, rpl, ar, rf = B.offer_many, B.offer, B.readmit, B.commit, B.record_pages_links, B.add_root, B.refund

    def offer_many(self, records, fps, host_keys):
        out = om(self, records, fps, host_keys)
        rec(("om", list(records), list(fps), list(host_keys), out))
        return out

    def offer(self, url, record, fp, host_key=None):
        out = o(self, url, record, fp, host_key)
        rec(("o", url, record, fp, host_key, out))
        return out

    def readmit(self, limit, *, advance):
        out = rm(self, limit, advance=advance)
        rec(("rm", limit, advance, len(out)))
        return out

    def commit(self, then=None):
        rec(("c",))
        return c(self, then)

    def record_pages_links(self, pages):
        pages = [(p, list(h)) for p, h in pages]
        rec(("rpl", pages))
        return rpl(self, pages)

    def add_root(self, url):
        rec(("ar", url))
        return ar(self, url)

    def refund(self, url):
        rec(("rf", url))
        return rf(self, url)

    B.offer_many, B.offer, B.readmit, B.commit = offer_many, offer, readmit, commit
    B.record_pages_links, B.add_root, B.refund = record_pages_links, add_root, refund
    apply = graph.DomainGraph.apply

    def applied(self, results):
        rec(("ap", [(r.seq, r.unique, bytes(r.aux)) for r in results]))
        return apply(self, results)

    graph.DomainGraph.apply = applied


if _OUT:
    try:
        _install(_OUT)
    except Exception as e:      # a bench hook never stops the crawl
        import sys
        print("budget call recorder not installed:", e, file=sys.stderr)
