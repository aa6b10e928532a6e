"""BEAST's table audit (crawlerd.frontier.budgets.audit): silent on consistent tables, and names the
broken invariant when one table disagrees with another (a damaged file, or a bug in BEAST)."""

import struct

import pytest

from crawlerd.frontier.budgets import domain_key
from crawlerd.frontier.budgets.audit import check_tables


def _deferred(parts):
    parts.offer("x.com", [f"r{i}".encode() for i in range(6)])     # two pass, four wait
    parts.beast.check_invariants()                                   # commits: the tables agree
    return parts.store


def test_consistent_tables_pass_and_a_wrong_count_is_named(parts):
    st = _deferred(parts)
    check_tables(st, waiting=parts.beast.waiting, reader=parts.beast.reader)
    with pytest.raises(AssertionError, match="deferred URLs stored"):
        check_tables(st, waiting=parts.beast.waiting + 1, reader=parts.beast.reader)


def test_a_domain_missing_from_its_queue_is_named(parts):
    st = _deferred(parts)
    dk = domain_key("x.com")
    txn = st.txn()
    keys = [bytes(k) for k in txn.cursor(db=st.queues).iternext(values=False) if bytes(k[8:]) == dk]
    assert len(keys) == 1
    txn.delete(keys[0], db=st.queues)
    with pytest.raises(AssertionError, match="x.com: not listed in its queue"):
        check_tables(st, waiting=parts.beast.waiting, reader=parts.beast.reader)


def test_a_domain_listed_behind_the_reader_is_named(parts):
    st = _deferred(parts)
    dk = domain_key("x.com")
    txn = st.txn()
    [key] = [bytes(k) for k in txn.cursor(db=st.queues).iternext(values=False) if bytes(k[8:]) == dk]
    q = struct.unpack(">Q", key[:8])[0]
    with pytest.raises(AssertionError, match="behind the reader"):
        check_tables(st, waiting=parts.beast.waiting, reader=q + 1)
