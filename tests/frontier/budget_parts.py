"""STAR/BEAST budget parts opened together in one directory, for the budgets' tests: store, graph,
BEAST and a one-thread edge DRUM, optionally with the store on a writer thread."""

import asyncio
import os
import threading

from crawlerd.frontier.budgets import (
    Beast,
    BudgetRule,
    BudgetStore,
    DomainGraph,
    EdgeDrum,
)
from crawlerd.store.writer import WriteThread
from crawlerd.url.hosts import registered_domain

RULE = dict(base_budget=2, per_inlink=3, max_budget=50)


class RecordingEnv:
    """An LMDB environment that notes the threads beginning write transactions while ``recording``."""

    def __init__(self, env):
        self._env = env
        self.recording = False
        self.write_threads: set[int] = set()

    def begin(self, *args, **kw):
        if self.recording and kw.get("write"):
            self.write_threads.add(threading.get_ident())
        return self._env.begin(*args, **kw)

    def __getattr__(self, name):
        return getattr(self._env, name)


class Landing:
    """A WriteThread on an event loop of this (the loop's) thread, which the test runs now and then:
    commits handed over land only while it runs."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.writer = WriteThread(self.loop, group_delay_s=0.001)

    def land(self, store):
        for _ in range(2000):
            self.loop.run_until_complete(asyncio.sleep(0.002))
            if not store.overlay.pending:
                return
        raise AssertionError("budget commits did not land")

    def close(self):
        self.writer.close()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


class Parts:
    """Store, graph, BEAST and a one-thread edge DRUM in one directory, opened together; with
    ``landing``, the store writes on its writer thread (an env that records write transactions)."""

    def __init__(self, path, *, mode="vouched", ratio=0.5, cache=64, queues=4, max_spread=64, rule=None,
                 probation=False, landing=None, read_cache_bytes=1024):
        self.path = str(path)
        # with a writer, a read cache of a few entries: it evicts, and its answers are checked too
        self.store = BudgetStore(os.path.join(self.path, "state"), map_size_bytes=1 << 26, sync=False,
                                 read_cache_bytes=read_cache_bytes)
        self.graph = DomainGraph(self.store, mode=mode, vouch_ratio=ratio, cache_entries=cache)
        self.beast = Beast(self.store, self.graph, BudgetRule(**(rule or RULE)), queues=queues,
                           max_spread=max_spread, cache_entries=cache, probation=probation)
        self.edges = EdgeDrum(os.path.join(self.path, "edges"), self.graph, buckets=4, bucket_buffer_bytes=4096,
                              merge_bytes=1 << 20, cache_entries=1024)
        self.landing = landing
        if landing is not None:
            self.store.commit()
            self.env = self.store.env = RecordingEnv(self.store.env)
            self.store.attach_writer(landing.writer)
            self.env.recording = True

    def link(self, src, targets):
        """One page's links, mapped to registered domains the way the shard does."""
        self.edges.add(registered_domain(src), [registered_domain(t) for t in targets])

    def offer(self, pld, records):
        return [r for r in records if self.beast.offer(pld, r)]

    def check(self):
        self.beast.check_invariants()
        self.graph.check_invariants()

    def close(self):
        if self.landing is not None:
            self.store.commit()
            self.landing.land(self.store)
            self.env.recording = False
        self.store.close()
        self.edges.close()


def drain(beast, limit=10_000, calls=10_000):
    out = []
    for _ in range(calls):
        got = beast.readmit(limit, advance=True)
        if not got:
            return out
        out.extend(got)
    raise AssertionError("readmit kept returning records")


def to_format_4(state: str) -> int:
    """Lay a closed budget state out as FIFO format 4 did: the domain records (``deferred`` keys
    without a NUL, ending in ``RECORD``) back in their own ``domains`` table, the meta saying format
    4. Returns the records moved."""
    import json

    import lmdb

    from crawlerd.frontier.budgets.store import RECORD
    env = lmdb.open(state, max_dbs=8, map_size=1 << 26)
    deferred, domains, meta = (env.open_db(n) for n in (b"deferred", b"domains", b"meta"))
    with env.begin(write=True) as txn:
        rows = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=deferred) if b"\0" not in k]
        for k, v in rows:
            assert k.endswith(RECORD)
            txn.delete(k, db=deferred)
            txn.put(k[:-len(RECORD)], v, db=domains)
        m = json.loads(txn.get(b"beast", db=meta))
        m["fifo"] = 4
        txn.put(b"beast", json.dumps(m).encode(), db=meta)
    env.close()
    return len(rows)
