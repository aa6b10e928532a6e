"""Bench only: count what the writer thread writes into each overlay store's tables.

Loaded by Python at start when this directory is on ``PYTHONPATH`` and ``CRAWLERD_WRITE_COUNTS`` is
set (a path prefix); does nothing otherwise. It wraps ``Overlay._write`` (the writer thread's
sink of the budget, recrawl and DUST stores): before each group is written it reads, in a read
transaction on the last commit, the value every put and delete replaces, and counts per table
puts, deletes, key and value bytes, new keys, puts of the value already stored, keys written in
two layers of one group, puts then deleted in one group of a key the last commit did not hold,
deletes of absent keys, and the writes a last-write-wins merge of the group's layers would leave;
per store its groups, layers and write transactions; and every sink's items handed to the
``WriteThread``. With ``CRAWLERD_WRITE_RECORD=DIR`` it also records each group (see ``_record``) for
``bench/writer_replay_bench.py``; put this directory on ``PYTHONPATH`` by its absolute path (the
crawl process starts in another directory). Every 2 s and at exit the counts go to ``<prefix>.<pid>.json``. The reads make
the writer slower: for counting runs, never for timing.

    CRAWLERD_WRITE_COUNTS=/tmp/wc PYTHONPATH=bench/write_counts unshare -n sh -c 'ip link set lo up;
      .venv/bin/python bench/e2e_bench.py --hosts 20000 --seeds 3000 --seconds 60 --runs 1 --schemes http
      --no-peer --json /tmp/wc-run.json'
    .venv/bin/python bench/write_counts_report.py /tmp/wc-run.json /tmp/wc.*.json
"""

import atexit
import importlib.abc
import json
import os
import sys
import threading
import time

_OUT = os.environ.get("CRAWLERD_WRITE_COUNTS")
# CRAWLERD_WRITE_RECORD=DIR: also record each overlay's groups (their layers' writes by table name)
# to DIR/<Store>.<pid>.rec for bench/writer_replay_bench.py, up to _RECORD_CAP bytes in all
_RECORD = os.environ.get("CRAWLERD_WRITE_RECORD")
_RECORD_CAP = int(os.environ.get("CRAWLERD_WRITE_RECORD_BYTES", 200 << 20))
_recorded = [0]
_rec_files: dict = {}
_TABLES: dict = {}      # "Store.table" -> counters
_SINKS: dict = {}       # "Owner.sink" -> items handed over
_NAMES: dict = {}       # id(db handle) -> "Store.table"
_STORES: dict = {}      # id(overlay) -> "Store"
_LOCK = threading.Lock()


def _dump() -> None:
    with _LOCK:
        doc = {"t": time.time(), "tables": {k: dict(v) for k, v in _TABLES.items()},
               "sinks": {k: (dict(v) if isinstance(v, dict) else v) for k, v in _SINKS.items()}}
    tmp = f"{_OUT}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, f"{_OUT}.{os.getpid()}.json")


def _dumper() -> None:
    while True:
        time.sleep(2)
        try:
            _dump()
        except OSError:
            pass


def _count_group(overlay, items) -> None:
    seen: dict = {}         # (db, key) -> value after this group's earlier layers (None: deleted)
    based: dict = {}        # (db, key) -> whether the last commit holds the key
    cnt: dict = {}
    txn = overlay.env.begin()
    try:
        for ops, _sync in items:
            for db, dels, puts in ops:
                c = cnt.setdefault(_NAMES.get(id(db), f"?{id(db)}"), {})
                if dels is None:
                    c["drops"] = c.get("drops", 0) + 1
                    continue
                for k, v in [(k, None) for k in dels] + list(puts):
                    sk = (id(db), k)
                    if sk in seen:
                        c["again_in_group"] = c.get("again_in_group", 0) + 1
                        prev = seen[sk]
                        if prev is not None and v is None and not based[sk]:
                            c["put_then_del_new"] = c.get("put_then_del_new", 0) + 1
                    else:
                        prev = txn.get(k, None, db=db)
                        based[sk] = prev is not None
                    seen[sk] = v
                    if v is None:
                        c["dels"] = c.get("dels", 0) + 1
                        if prev is None:
                            c["dels_absent"] = c.get("dels_absent", 0) + 1
                        continue
                    c["puts"] = c.get("puts", 0) + 1
                    c["value_bytes"] = c.get("value_bytes", 0) + len(v)
                    c["key_bytes"] = c.get("key_bytes", 0) + len(k)
                    if prev is None:
                        c["puts_new"] = c.get("puts_new", 0) + 1
                    elif bytes(prev) == v:
                        c["puts_same_value"] = c.get("puts_same_value", 0) + 1
    finally:
        txn.abort()
    # what a last-write-wins merge of the group's layers would write: one write per key, none for
    # a key deleted at the end that the last commit does not hold
    for (dbid, k), v in seen.items():
        c = cnt.setdefault(_NAMES.get(dbid, f"?{dbid}"), {})
        c["distinct_keys"] = c.get("distinct_keys", 0) + 1
        if v is not None or based[(dbid, k)]:
            c["merged_writes"] = c.get("merged_writes", 0) + 1
    with _LOCK:
        for name, c in cnt.items():
            t = _TABLES.setdefault(name, {})
            t["groups"] = t.get("groups", 0) + 1
            for k, n in c.items():
                t[k] = t.get(k, 0) + n


def _record(overlay, items) -> None:
    """Append one group to its store's recording: a pickled list of layers, each a list of
    (table, dels or None for a drop, puts); the first record of a file names the budget's tables."""
    import pickle
    name = _STORES.get(id(overlay), "?")
    if _recorded[0] >= _RECORD_CAP:
        return
    f = _rec_files.get(name)
    if f is None:
        f = _rec_files[name] = open(os.path.join(_RECORD, f"{name}.{os.getpid()}.rec"), "wb")
        budget = overlay._budget
        head = {"store": name, "pages": budget.pages if budget is not None else 0,
                "budget_dbs": [_NAMES.get(id(db), "?") for db in overlay._dbs],
                "tables": sorted({n for i, n in _NAMES.items()})}
        pickle.dump(head, f)
    group = [[(_NAMES.get(id(db), "?"), None if dels is None else list(dels), list(puts))
              for db, dels, puts in item[0]] for item in items]
    data = pickle.dumps(group, protocol=pickle.HIGHEST_PROTOCOL)
    _recorded[0] += len(data)
    f.write(len(data).to_bytes(8, "little") + data)
    f.flush()


def _patch() -> None:
    from crawlerd.store import overlay as ov
    from crawlerd.store import writer as wr
    init, write, submit = ov.Overlay.__init__, ov.Overlay._write, wr.WriteThread.submit

    def counted_init(self, env, *args, **kw):
        init(self, env, *args, **kw)
        store = sys._getframe(1).f_locals.get("self")       # the store that attached the overlay
        _STORES[id(self)] = type(store).__name__
        for attr, val in vars(store).items():
            vals = val if isinstance(val, list) else [val]
            for i, x in enumerate(vals):
                if type(x).__name__ == "_Database":
                    _NAMES[id(x)] = f"{type(store).__name__}.{attr.lstrip('_')}{i if len(vals) > 1 else ''}"

    def counted_write(self, items):
        _count_group(self, items)
        if _RECORD:
            _record(self, items)
        before = self.txns
        try:
            return write(self, items)
        finally:
            name = _STORES.get(id(self), "?")
            with _LOCK:
                s = _SINKS.setdefault("store:" + name, {"groups": 0, "layers": 0, "txns": 0})
                s["groups"] += 1
                s["layers"] += len(items)
                s["txns"] += self.txns - before

    def counted_submit(self, sink, item=None, then=None):
        owner = getattr(sink, "__self__", None)
        name = (type(owner).__name__ + "." if owner is not None else "") + getattr(sink, "__name__", "barrier")
        with _LOCK:
            _SINKS[name] = _SINKS.get(name, 0) + 1
        return submit(self, sink, item, then)

    ov.Overlay.__init__, ov.Overlay._write, wr.WriteThread.submit = counted_init, counted_write, counted_submit


class _OnImport(importlib.abc.MetaPathFinder):
    """Patches the overlay when crawlerd's frontier is first imported (the stores' package)."""

    def find_spec(self, name, path, target=None):
        if name == "crawlerd.frontier":
            sys.meta_path.remove(self)
            _patch()
        return None


if _OUT:
    sys.meta_path.insert(0, _OnImport())
    threading.Thread(target=_dumper, daemon=True, name="write-counts").start()
    atexit.register(_dump)
