"""BEAST's deferred FIFOs written as host runs (``budgets.fifo``): callers see exactly what one key
per URL gave them, and a state written one key per URL (format 2) opens as it is."""

import json
import os
import random

import lmdb
import pytest

from crawlerd.frontier.budgets import fifo
from crawlerd.layout import StateFormatError
from tests.frontier.budget_parts import Landing, Parts, drain, to_format_4


class Side:
    """One Parts whose FIFO writes runs of at most ``run_bytes`` (0: one key per URL, format 2)."""

    def __init__(self, path, run_bytes, monkeypatch, landing=None):
        self.run_bytes, self.mp = run_bytes, monkeypatch
        self.p = Parts(path, mode="all", cache=5, queues=3, max_spread=2, landing=landing)

    def __call__(self, fn, *args, **kw):
        self.mp.setattr(fifo, "RUN_BYTES", self.run_bytes)
        return fn(*args, **kw)


def _runs(p):
    """Run entries in the committed table (a key of turn, seq and RUN after the domain and NUL; the
    keys without a NUL are the domain records)."""
    p.store.commit()
    if p.landing is not None:
        p.landing.land(p.store)
    with p.store.env.begin() as txn:
        keys = [bytes(k) for k in txn.cursor(db=p.store.deferred).iternext(values=False) if b"\0" in k]
    return sum(len(k) - k.index(b"\0") - 1 == 17 and k.endswith(fifo.RUN) for k in keys)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("writer", [False, True])
def test_runs_hand_out_what_one_key_per_url_does_in_the_same_order(tmp_path, monkeypatch, seed, writer):
    """Pages' links (runs of a few hosts of a few domains, one URL at a time and in batches), partial
    readmissions that split runs, refunds, explains, commits and reopens: the two layouts readmit
    the same records in the same order, count the same waiting URLs, explain the same positions."""
    rng = random.Random(seed)
    landing = Landing() if writer else None
    sides = [Side(tmp_path / "runs", fifo.RUN_BYTES, monkeypatch, landing),
             Side(tmp_path / "plain", 0, monkeypatch, landing)]
    doms = [f"d{i}.com" for i in range(4)]
    fps: dict[bytes, tuple[str, int]] = {}
    serial = 0
    runs_seen = 0
    for step in range(400):
        op = rng.random()
        if op < 0.45:
            batch = []
            for _ in range(rng.randrange(1, 4)):
                d = rng.choice(doms)
                for _ in range(rng.randrange(1, 12)):
                    serial += 1
                    host = f"http://h{rng.randrange(3)}.{d}"
                    rec = f"{d}#{serial}".encode() * rng.choice((1, 1, 1, 40))     # some runs reach RUN_BYTES
                    batch.append((d, host, rec, serial))
                    fps[rec] = (d, serial)
            if rng.random() < 0.5:
                got = [[s(s.p.beast.offer, d, rec, fp, host) for d, host, rec, fp in batch] for s in sides]
            else:
                from crawlerd.frontier.budgets import domain_key
                cols = ([domain_key(d) for d, *_ in batch], [r for _, _, r, _ in batch],
                        [f for *_, f in batch], [h for _, h, _, _ in batch])
                got = [s(s.p.beast.offer_many, *cols) for s in sides]
            assert got[0] == got[1], step
        elif op < 0.75:
            limit, advance = rng.choice((1, 2, 3, 7, 50)), rng.random() < 0.7
            got = [s(s.p.beast.readmit, limit, advance=advance) for s in sides]
            assert got[0] == got[1], step
        elif op < 0.8:
            d = rng.choice(doms)
            assert sides[0](sides[0].p.beast.refund, d) == sides[1](sides[1].p.beast.refund, d)
        elif op < 0.85 and fps:
            rec = rng.choice(list(fps))
            d, fp = fps[rec]
            a, b = (s(s.p.beast.explain, d, fp) for s in sides)
            assert a == b, step
        elif op < 0.95:
            runs_seen += sides[0](_runs, sides[0].p)
            assert sides[1](_runs, sides[1].p) == 0
            for s in sides:
                s(s.p.check)
        else:
            for s in sides:
                s(s.p.close)
                s.p = Parts(s.p.path, mode="all", cache=5, queues=3, max_spread=2, landing=landing)
        assert sides[0].p.beast.waiting == sides[1].p.beast.waiting, step
    assert runs_seen > 0                            # runs were written (and split by the readmissions)
    assert sides[0](drain, sides[0].p.beast) == sides[1](drain, sides[1].p.beast)
    for s in sides:
        s(s.p.check)
        assert s.p.beast.waiting == 0
        s(s.p.close)
    if landing is not None:
        landing.close()


def test_a_backlog_written_one_key_per_url_opens_and_keeps_its_order(tmp_path, monkeypatch):
    """Format 2 (main before runs: one key per URL, no ``waiting`` in the meta): read as it is,
    its waiting URLs counted, new deferrals written as runs behind it in turn order."""
    monkeypatch.setattr(fifo, "RUN_BYTES", 0)
    p = Parts(tmp_path / "b", mode="all")
    for i in range(8):
        p.beast.offer("x.com", f"a{i}".encode(), host="http://a.x.com")
    p.close()
    to_format_4(os.path.join(str(tmp_path / "b"), "state"))      # the domain records in their own table
    env = lmdb.open(os.path.join(str(tmp_path / "b"), "state"), max_dbs=8, map_size=1 << 26)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        m = json.loads(txn.get(b"beast", db=meta))
        del m["waiting"]
        m["fifo"] = 2
        txn.put(b"beast", json.dumps(m).encode(), db=meta)
    env.close()
    monkeypatch.setattr(fifo, "RUN_BYTES", 1536)
    p = Parts(tmp_path / "b", mode="all")
    assert p.beast.waiting == 6
    for i in range(8, 12):
        p.beast.offer("x.com", f"a{i}".encode(), host="http://a.x.com")
    p.beast.offer("x.com", b"b0", host="http://b.x.com")
    p.check()
    assert _runs(p) > 0
    assert drain(p.beast) == [b"a2", b"b0", b"a3", b"a4", b"a5", b"a6", b"a7", b"a8", b"a9", b"a10", b"a11"]
    p.check()
    p.close()


def test_a_fifo_of_a_newer_format_is_refused_by_name(tmp_path):
    """A FIFO format past 3 (a downgrade after a newer crawlerd ran): refused as main refuses one,
    by StateFormatError (the daemon exits 2), never read as runs."""
    p = Parts(tmp_path / "b", mode="all")
    p.close()
    env = lmdb.open(os.path.join(str(tmp_path / "b"), "state"), max_dbs=8, map_size=1 << 26)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        m = json.loads(txn.get(b"beast", db=meta))
        m["fifo"] = 99
        txn.put(b"beast", json.dumps(m).encode(), db=meta)
    env.close()
    with pytest.raises(StateFormatError, match="format 99, written by a newer crawlerd"):
        Parts(tmp_path / "b", mode="all")


# -- format 4: the host that started a domain's backlog keeps its turn in the domain record ----------

def _offer_pages(p, rng, pages):
    """``pages`` pages' worth of deferrals: a few domains, mostly one host each, some with several."""
    for step in range(pages):
        d = f"d{rng.randrange(5)}.com"
        hosts = [f"http://{d}"] if d < "d3" else [f"http://h{rng.randrange(4)}.{d}" for _ in range(3)]
        for h in hosts:
            for k in range(rng.randrange(1, 6)):
                p.beast.offer(d, f"{h}/{step}/{k}".encode(), step * 10 + k, h)
        if rng.random() < 0.3:
            p.beast.readmit(4, advance=rng.random() < 0.5)
        if rng.random() < 0.4:
            p.store.commit()


def test_a_backlog_of_one_host_keeps_no_host_turns_table_entry(tmp_path):
    """Format 4: a domain whose backlog is one host's writes its turns into its record only (the
    ``turns`` table stays empty), and still hands out in turn order through a reopen."""
    p = Parts(tmp_path / "b", mode="all")
    for i in range(12):
        p.beast.offer("x.com", f"a{i}".encode(), host="http://x.com")
        if i % 4 == 3:
            p.store.commit()
    p.close()
    p = Parts(tmp_path / "b", mode="all")
    p.beast.offer("x.com", b"b0", host="http://b.x.com")       # a second host: in the table
    p.store.commit()
    with p.store.env.begin() as txn:
        assert [bytes(k[-8:]) for k in txn.cursor(db=p.store.turns).iternext(values=False)] == \
            [fifo_host_hash("http://b.x.com")]
    p.check()
    assert drain(p.beast) == [b"a2", b"b0"] + [f"a{i}".encode() for i in range(3, 12)]
    p.check()
    p.close()


def fifo_host_hash(host):
    from crawlerd.frontier.budgets.beast import _host_hashes
    return _host_hashes[host][1]


def _two_stores_offered(tmp_path, seed: int) -> None:
    """Two stores, ``plain`` and ``old``, offered the same pages and closed."""
    for p in (Parts(tmp_path / "plain", mode="all"), Parts(tmp_path / "old", mode="all")):
        _offer_pages(p, random.Random(seed), 40)
        p.close()


def _assert_they_hand_out_the_same(plain: Parts, old: Parts, seed: int) -> None:
    """Both offered the same further pages, tables checked, then drained: the same URLs in the same order."""
    for p in (plain, old):
        _offer_pages(p, random.Random(seed + 50), 40)
        p.check()
    assert drain(old.beast) == drain(plain.beast)
    old.check()
    plain.close()
    old.close()


@pytest.mark.parametrize("seed", range(3))
def test_a_format_4_state_with_its_domain_records_in_their_own_table_opens_and_hands_out_the_same(tmp_path, seed):
    """A state of format 4 (the domain records in ``domains``) opens with its records moved into
    ``deferred`` after each domain's entries, in the commit that records format 5: nothing is left
    in ``domains``, the tables check, and every URL comes out in the order of a store that never
    changed format."""
    _two_stores_offered(tmp_path, seed)
    assert to_format_4(os.path.join(str(tmp_path / "old"), "state")) > 0
    plain, old = Parts(tmp_path / "plain", mode="all"), Parts(tmp_path / "old", mode="all")
    old.store.commit()
    with old.store.env.begin() as txn:
        assert txn.stat(old.store.domains)["entries"] == 0
        assert json.loads(txn.get(b"beast", db=old.store.meta))["fifo"] == 5
    assert old.beast.domain("d1.com") == plain.beast.domain("d1.com")
    _assert_they_hand_out_the_same(plain, old, seed)


@pytest.mark.parametrize("seed", range(3))
def test_a_format_3_state_with_every_host_in_the_turns_table_opens_and_hands_out_the_same(tmp_path, seed):
    """A state of format 3 (every host's next turn in ``turns``, records without the first host)
    opens as it is: a backlog it holds keeps its host turns from the table, new deferrals follow in
    turn order, and every URL comes out in the order of a store that never changed format."""
    import struct
    _two_stores_offered(tmp_path, seed)
    to_format_4(os.path.join(str(tmp_path / "old"), "state"))    # the domain records in their own table
    env = lmdb.open(os.path.join(str(tmp_path / "old"), "state"), max_dbs=8, map_size=1 << 26)
    domains, turns, meta = (env.open_db(n) for n in (b"domains", b"turns", b"meta"))
    moved = 0
    with env.begin(write=True) as txn:
        for dk, raw in list(txn.cursor(db=domains)):
            host, host_next = struct.unpack_from("<QQ", raw, 64)
            if host_next:
                txn.put(bytes(dk) + b"\0" + struct.pack("<Q", host), struct.pack(">Q", host_next), db=turns)
                moved += 1
            txn.put(bytes(dk), bytes(raw[:64]), db=domains)          # the format 3 record
        m = json.loads(txn.get(b"beast", db=meta))
        m["fifo"] = 3
        txn.put(b"beast", json.dumps(m).encode(), db=meta)
    env.close()
    assert moved > 0
    _assert_they_hand_out_the_same(Parts(tmp_path / "plain", mode="all"), Parts(tmp_path / "old", mode="all"), seed)


@pytest.mark.parametrize("seed", range(6))
def test_take_first_takes_the_fifos_first_urls_and_leaves_each_runs_rest_as_one_by_one_did(seed):
    """A domain's entries (runs of a few hosts at interleaving turns, single URLs): ``take_first``
    hands out the same URLs in the same order as all of them sorted, and leaves the rests that
    ``pack_rest`` of the runs' remaining URLs writes."""
    rng = random.Random(seed)
    head = b"d.com\0"
    buf = fifo.RunBuffer()
    hosts, fps, recs = [], [], []
    seq = 0
    for h in range(rng.randrange(1, 5)):
        turn = rng.randrange(4)
        for _ in range(rng.randrange(1, 4)):            # a few blocks of this host, turns following
            k = rng.randrange(1, 6)
            i = len(hosts)
            hosts += [f"h{h}"] * k
            fps += [rng.getrandbits(64) for _ in range(k)]
            recs += [f"h{h}/{seq + x}".encode() for x in range(k)]
            buf.add_block(head + bytes([h]) * 8, turn, seq, hosts, fps, recs, i, i + k)
            seq += k
            turn += k + rng.randrange(2)                # sometimes a gap: a new run
    got = buf.take()
    at = len(head)
    urls = sorted(u for key, value in got for u in fifo.entries(key, value, at))
    for n in range(1, len(urls) + 1):
        out: list[bytes] = []
        turn, gone, rest = fifo.take_first(got[:n], at, n, out)
        assert out == [v[8:] for _, v in urls[:n]]
        assert turn == fifo.turn_of(urls[n - 1][0])
        want_rest = []
        for key, value in got[:n]:
            run = fifo.entries(key, value, at)
            left = [u for u in run if u > urls[n - 1]]
            if len(left) < len(run):
                assert key in gone
                if left:
                    want_rest.append(fifo.pack_rest(head, left))
            else:
                assert key not in gone
        assert sorted(rest) == sorted(want_rest)
