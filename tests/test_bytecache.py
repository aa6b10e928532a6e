"""ByteLRU: bounded in bytes, least recently used out first, against a list model."""

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd.bytecache import ENTRY_OVERHEAD, ByteLRU, str_bytes

OPS = st.lists(st.tuples(st.sampled_from(["put", "get", "pop", "replace"]), st.integers(0, 20), st.integers(0, 300)),
               max_size=200)


def _model_put(model, where, key, size, cap):
    """The model's put: the key (at ``where``, if held) moves to the recent end, within ``cap``."""
    if where is not None:
        model.pop(where)
    cost = size + ENTRY_OVERHEAD
    if cost <= cap:
        model.append((key, size, cost))
        while sum(e[2] for e in model) > cap:
            model.pop(0)


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(0, 3000), ops=OPS)
def test_matches_an_lru_model_and_never_exceeds_the_cap(cap, ops):
    c = ByteLRU(cap)
    model: list[tuple[int, int, int]] = []      # (key, value, cost), least recent first
    for op, key, size in ops:
        where = next((i for i, e in enumerate(model) if e[0] == key), None)
        if op == "put":
            _model_put(model, where, key, size, cap)
            c.put(key, size, size)
        elif op == "replace":                  # a put for a key held; a key not held is not added
            if where is not None:
                _model_put(model, where, key, size, cap)
            c.replace_present({key + 100: size, key: size}, lambda k, v: v)
        elif op == "get":
            assert c.get(key) == (model[where][1] if where is not None else None)
            if where is not None:
                model.append(model.pop(where))
        else:
            assert c.pop(key) == (model.pop(where)[1] if where is not None else None)
        assert list(c) == [e[0] for e in model]
        assert c.bytes == sum(e[2] for e in model) <= cap


def test_peek_does_not_refresh_and_evictions_are_reported():
    gone = []
    c = ByteLRU(3 * (ENTRY_OVERHEAD + 10), on_evict=lambda k, v: gone.append(k))
    for k in "abc":
        c.put(k, k.upper(), 10)
    assert c.peek("a") == "A"
    c.put("d", "D", 10)
    assert gone == ["a"] and "a" not in c
    c.get("b")
    c.put("e", "E", 10)
    assert gone == ["a", "c"]
    assert c.memory() == {"bytes": 3 * (ENTRY_OVERHEAD + 10), "cap_bytes": c.cap_bytes, "entries": 3,
                          "evictions": 2}


def test_estimate_covers_what_an_entry_really_costs():
    """The documented per-entry estimate is at least what CPython spends (str keys, no value)."""
    keys = [f"https://host-{i}.example.org" for i in range(50_000)]
    c = ByteLRU(1 << 40)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in keys:
            c.put(k, None, 0)
        real = (tracemalloc.get_traced_memory()[0] - before) / len(keys)
    finally:
        tracemalloc.stop()
    est = c.bytes / len(keys)
    assert real <= est <= 2 * real, (real, est)
    assert str_bytes("abc") == 52 and str_bytes("é") > str_bytes("e")
