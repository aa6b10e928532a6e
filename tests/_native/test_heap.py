"""DueHeap: native and reference run the same operation sequences against a dict model."""

import math
import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from crawlerd._native.heap import DueHeap
from crawlerd._native.heap_ref import RefDueHeap

IMPLS = [DueHeap, RefDueHeap]


def model_min(model: dict[int, float]) -> tuple[int, float]:
    host = min(model, key=lambda h: (model[h], h))
    return host, model[host]


@pytest.mark.parametrize("impl", IMPLS, ids=lambda c: c.__name__)
class TestDueHeap:
    def test_pop_order_and_ties_by_host(self, impl):
        h = impl()
        for host, due in [(5, 2.0), (3, 1.0), (9, 1.0), (1, 3.0), (0, 1.0)]:
            h.push(host, due)
        assert h.peek() == (0, 1.0)
        assert [h.pop() for _ in range(5)] == [(0, 1.0), (3, 1.0), (9, 1.0), (5, 2.0), (1, 3.0)]
        assert h.peek() is None
        with pytest.raises(IndexError):
            h.pop()

    def test_errors(self, impl):
        h = impl()
        h.push(7, 1.0)
        with pytest.raises(ValueError):
            h.push(7, 2.0)
        with pytest.raises(KeyError):
            h.update(8, 1.0)
        for bad in (-1, 2**31, 2**70):
            with pytest.raises(ValueError):
                h.push(bad, 1.0)
            assert bad not in h
            assert h.due_of(bad) is None
            assert h.remove(bad) is False
        with pytest.raises(ValueError):
            h.push(1, math.nan)
        with pytest.raises(ValueError):
            h.update(7, math.nan)
        with pytest.raises(ValueError):
            h.pop_due(10.0, -1)
        with pytest.raises(TypeError):
            h.push(1.5, 1.0)
        assert len(h) == 1 and h.due_of(7) == 1.0

    def test_update_both_directions_and_remove(self, impl):
        h = impl()
        for host in range(100):
            h.push(host, float(host))
        h.update(50, -1.0)
        h.update(0, 1000.0)
        assert h.peek() == (50, -1.0)
        assert h.remove(50) is True and h.remove(50) is False
        assert 50 not in h and 0 in h
        assert h.due_of(0) == 1000.0
        h.push_or_update(0, 0.5)
        h.push_or_update(200, 0.25)
        assert h.pop_due(0.5, 10) == [200, 0]
        assert h.pop_due(3.0, 2) == [1, 2]
        assert h.pop_due(3.0, 0) == []
        h.check_invariant()
        h.clear()
        assert len(h) == 0 and 3 not in h
        h.push(3, 1.0)
        assert h.pop() == (3, 1.0)

    def test_infinities_and_large_ids(self, impl):
        # 2**27: a large id costs the native heap 512 MiB of address space, untouched
        # (calloc'd zero pages), so the test stays cheap; 2**31 - 1 works alike.
        h = impl(capacity=1)
        h.push(2**27, math.inf)
        h.push(0, -math.inf)
        h.push(12345, 0.0)
        assert h.pop_due(math.inf, 10) == [0, 12345, 2**27]

    def test_random_ops_match_model(self, impl):
        rng = random.Random(1234)
        h = impl(capacity=4)
        model: dict[int, float] = {}
        for _ in range(20000):
            op = rng.random()
            host = rng.randrange(300)
            due = float(rng.randrange(50))  # few distinct values: many ties
            if op < 0.3:
                if host in model:
                    with pytest.raises(ValueError):
                        h.push(host, due)
                else:
                    h.push(host, due)
                    model[host] = due
            elif op < 0.45:
                if host in model:
                    h.update(host, due)
                    model[host] = due
                else:
                    with pytest.raises(KeyError):
                        h.update(host, due)
            elif op < 0.55:
                h.push_or_update(host, due)
                model[host] = due
            elif op < 0.65:
                assert h.remove(host) is (model.pop(host, None) is not None)
            elif op < 0.8:
                now, limit = float(rng.randrange(50)), rng.randrange(6)
                got = h.pop_due(now, limit)
                want = []
                while model and len(want) < limit:
                    top, top_due = model_min(model)
                    if top_due > now:
                        break
                    want.append(top)
                    del model[top]
                assert got == want
            elif op < 0.9:
                if model:
                    want = model_min(model)
                    del model[want[0]]
                    assert h.pop() == want
                else:
                    assert h.peek() is None
            else:
                assert h.due_of(host) == model.get(host)
                assert (host in h) == (host in model)
            assert len(h) == len(model)
        h.check_invariant()


class HeapMachine(RuleBasedStateMachine):
    """Hypothesis drives both implementations with the same operations."""

    def __init__(self):
        super().__init__()
        self.native = DueHeap(capacity=2)
        self.ref = RefDueHeap(capacity=2)

    hosts = st.integers(min_value=0, max_value=40)
    dues = st.sampled_from([0.0, 1.0, 1.5, 2.0, -3.0, math.inf, 1e9])

    def both(self, name, *args):
        results = []
        for impl in (self.native, self.ref):
            try:
                results.append(("ok", getattr(impl, name)(*args)))
            except Exception as exc:  # compare the exception type, not the message
                results.append(("raise", type(exc)))
        assert results[0] == results[1], (name, args, results)

    @rule(host=hosts, due=dues)
    def push(self, host, due):
        self.both("push", host, due)

    @rule(host=hosts, due=dues)
    def update(self, host, due):
        self.both("update", host, due)

    @rule(host=hosts, due=dues)
    def push_or_update(self, host, due):
        self.both("push_or_update", host, due)

    @rule(host=hosts)
    def remove(self, host):
        self.both("remove", host)

    @precondition(lambda self: len(self.ref) > 0)
    @rule()
    def pop(self):
        self.both("pop")

    @rule(now=dues, limit=st.integers(0, 5))
    def pop_due(self, now, limit):
        self.both("pop_due", now, limit)

    @rule(host=hosts)
    def due_of(self, host):
        self.both("due_of", host)

    @rule()
    def clear(self):
        self.both("clear")

    @invariant()
    def same_state(self):
        assert len(self.native) == len(self.ref)
        assert self.native.peek() == self.ref.peek()
        self.native.check_invariant()
        self.ref.check_invariant()


TestHeapMachine = HeapMachine.TestCase
TestHeapMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
