"""BEAST's tables checked against each other by a full scan (``Beast.check_invariants``: tests and
``crawlerd check``): the deferred URLs stored match the count kept (the ``deferred`` table's entries;
its keys without a NUL are the domain records), each domain with deferred URLs
is listed in exactly its queue, at or after the reader, and host turns are kept only while URLs wait.
"""

from __future__ import annotations

import struct

from crawlerd.frontier.budgets import fifo
from crawlerd.frontier.budgets.store import RECORD, BudgetStore, DomainRecord, domain_name

_U64BE = struct.Struct(">Q")     # a ``queues`` key: queue number, then the domain key
_FP_SIZE = 8                     # a ``turns`` key ends with NUL and a host hash of this size


def check_tables(store: BudgetStore, *, waiting: int, reader: int) -> None:
    """Scan the committed tables of ``store`` and raise AssertionError naming the first broken
    invariant; ``waiting`` is the deferred URLs BEAST counts, ``reader`` the queue it stands on."""
    st = store
    txn = st.txn()
    counts: dict[bytes, int] = {}
    records: list[tuple[bytes, bytes]] = []
    for k, v in txn.cursor(db=st.deferred):
        at = k.find(b"\0") + 1
        if not at:                  # a domain record (key | RECORD)
            assert k[-1:] == RECORD, f"{bytes(k)!r}: in deferred, neither an entry nor a domain record"
            records.append((bytes(k[:-1]), bytes(v)))
            continue
        dk = bytes(k[:at - 1])
        counts[dk] = counts.get(dk, 0) + fifo.count(k, v, at)
    assert sum(counts.values()) == waiting, f"{sum(counts.values())} deferred URLs stored, {waiting} counted"
    turned = {bytes(k[:-1 - _FP_SIZE]) for k in txn.cursor(db=st.turns).iternext(values=False)}
    listed: dict[bytes, int] = {}
    for k in txn.cursor(db=st.queues).iternext(values=False):
        q, dk = _U64BE.unpack_from(k)[0], bytes(k[8:])
        assert dk not in listed, f"{domain_name(dk)} listed in queues {listed[dk]} and {q}"
        assert q >= reader, f"{domain_name(dk)} listed in queue {q}, behind the reader at {reader}"
        listed[dk] = q
    assert not txn.stat(st.domains)["entries"], "domain records left in the table of FIFO format 4"
    for dk, raw in records:
        d = DomainRecord.decode(raw)
        name = domain_name(dk)
        assert d.deferred or (d.turn == 0 and d.host_next == 0 and dk not in turned), \
            f"{name}: host turns kept with nothing deferred"
        assert d.deferred == counts.pop(dk, 0), f"{name}: deferred count {d.deferred} != stored"
        if d.deferred:
            assert listed.pop(dk, None) == d.queue - 1, f"{name}: not listed in its queue {d.queue - 1}"
        else:
            assert d.queue == 0 and dk not in listed, f"{name}: listed with nothing deferred"
    assert not counts, f"deferred URLs of domains without a record: {sorted(counts)[:3]}"
    assert not listed, f"queues list domains without a record: {sorted(listed)[:3]}"
