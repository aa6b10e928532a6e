"""Bench only: count what the writer thread writes into each overlay store's tables.

Loaded by Python at start when this directory is on ``PYTHONPATH`` and ``CRAWLERD_WRITE_COUNTS`` is
set (a path prefix); does nothing otherwise. It wraps ``Overlay._write`` (the writer thread's
sink of the budget, recrawl and DUST stores): before each group is written it reads, in a read
transaction on the last commit, the value every put and delete replaces, and counts per table
puts, deletes, key and value bytes, new keys, puts of the value already stored, keys written in
two layers of one group, and deletes of absent keys; and counts every sink's items handed to the
``WriteThread``. Every 2 s and at exit the counts go to ``<prefix>.<pid>.json``. The reads make
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
_TABLES: dict = {}      # "Store.table" -> counters
_SINKS: dict = {}       # "Owner.sink" -> items handed over
_NAMES: dict = {}       # id(db handle) -> "Store.table"
_LOCK = threading.Lock()


def _dump() -> None:
    with _LOCK:
        doc = {"t": time.time(), "tables": {k: dict(v) for k, v in _TABLES.items()}, "sinks": dict(_SINKS)}
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
                    else:
                        prev = txn.get(k, None, db=db)
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
    with _LOCK:
        for name, c in cnt.items():
            t = _TABLES.setdefault(name, {})
            t["groups"] = t.get("groups", 0) + 1
            for k, n in c.items():
                t[k] = t.get(k, 0) + n


def _patch() -> None:
    from crawlerd.store import overlay as ov
    from crawlerd.store import writer as wr
    init, write, submit = ov.Overlay.__init__, ov.Overlay._write, wr.WriteThread.submit

    def counted_init(self, env, *args, **kw):
        init(self, env, *args, **kw)
        store = sys._getframe(1).f_locals.get("self")       # the store that attached the overlay
        for attr, val in vars(store).items():
            vals = val if isinstance(val, list) else [val]
            for i, x in enumerate(vals):
                if type(x).__name__ == "_Database":
                    _NAMES[id(x)] = f"{type(store).__name__}.{attr.lstrip('_')}{i if len(vals) > 1 else ''}"

    def counted_write(self, items):
        _count_group(self, items)
        return write(self, items)

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
