"""Dirty-page buffers reserved at open: later transactions that change fewer pages take no new C heap,
and the reservation leaves the store as it was."""

import ctypes
import random

import lmdb
import pytest

from crawlerd.store.lmdb_reserve import reserve_write_buffers


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_in_use():
    try:
        libc = ctypes.CDLL("libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        pytest.skip("needs glibc 2.33+ (mallinfo2)")
    fn.restype = _MallInfo2
    return lambda: fn().uordblks


def _open(path):
    return lmdb.open(str(path), map_size=1 << 30, max_dbs=2, sync=False, metasync=False, meminit=False)


def _grow(env, db, rng, txns=60, puts=400):
    """Random puts into a growing B-tree: each transaction changes more distinct pages than the last."""
    for _ in range(txns):
        with env.begin(write=True) as txn:
            for _ in range(puts):
                txn.put(rng.randbytes(16), rng.randbytes(90), db=db)


@pytest.mark.parametrize("reserve", [0, 4 << 20])
def test_reserved_buffers_absorb_the_climb(tmp_path, reserve):
    used = _heap_in_use()
    env = _open(tmp_path / "e")
    before = used()
    pages = reserve_write_buffers(env, reserve)
    assert pages == reserve // env.stat()["psize"]
    assert used() - before >= reserve * 0.9          # the buffers are held, not given back
    db = env.open_db(b"t")
    start = used()
    _grow(env, db, random.Random(7))
    climb = used() - start
    if reserve:
        assert climb < 256 << 10, climb               # every transaction fit in the reserved buffers
    else:
        assert climb > 1 << 20, climb                 # without them the buffers climb with the tree
    env.close()


def test_reservation_writes_nothing(tmp_path):
    env = _open(tmp_path / "e")
    db = env.open_db(b"t")
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v", db=db)
    info = env.info()
    reserve_write_buffers(env, 1 << 20)
    assert env.info()["last_txnid"] == info["last_txnid"]      # aborted: no commit
    with env.begin() as txn:
        assert [k for k, _ in txn.cursor()] == [b"t"]           # the main DB holds only the named DB
        assert txn.get(b"k", db=db) == b"v"
    env.close()
    env = _open(tmp_path / "e")
    with env.begin() as txn:
        assert [k for k, _ in txn.cursor()] == [b"t"]
    env.close()


def test_nothing_to_reserve(tmp_path):
    env = _open(tmp_path / "e")
    assert reserve_write_buffers(env, 0) == 0
    assert reserve_write_buffers(env, 100) == 0
    env.close()
