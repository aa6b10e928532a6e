"""DigestSet: first capture wins, digests in any notation, survives reopen, one owner."""

import base64
import hashlib
import os
import subprocess
import sys

import pytest

from crawlerd.store.digest_set import DigestSet, DigestView, digest_key


def test_first_capture_wins_and_notations_agree(tmp_path):
    raw = hashlib.sha1(b"payload").digest()
    b32 = "sha1:" + base64.b32encode(raw).decode()
    with DigestSet(tmp_path / "d") as ds:
        assert ds.get(raw) is None and raw not in ds
        assert ds.add(b32, "http://a.test/x", "2024-05-01T12:00:00Z") is True
        assert ds.add(raw.hex(), "http://b.test/y", "2024-06-01T00:00:00Z") is False
        assert ds.get(raw) == ("http://a.test/x", "2024-05-01T12:00:00Z")
        assert ds.get(b32.lower()) == ds.get(raw.hex().upper()) == ds.get(bytearray(raw))
        assert len(ds) == 1
        other = hashlib.sha1(b"other").digest()
        assert ds.add_many([(other, "http://c.test/ü", "d1"), (other, "http://d.test/", "d2")]) == [True, False]
        assert ds.get(other) == ("http://c.test/ü", "d1")


def test_survives_reopen(tmp_path):
    digests = [hashlib.sha1(str(i).encode()).digest() for i in range(500)]
    with DigestSet(tmp_path / "d") as ds:
        for i, d in enumerate(digests):
            assert ds.add(d, f"http://h{i}.test/", f"2024-01-01T00:00:{i % 60:02d}Z")
    with DigestSet(tmp_path / "d") as ds:
        assert len(ds) == 500
        assert ds.get(digests[123]) == ("http://h123.test/", "2024-01-01T00:00:03Z")
        assert ds.add(digests[0], "http://late.test/", "x") is False


def test_single_owner(tmp_path):
    with DigestSet(tmp_path / "d"):
        with pytest.raises(RuntimeError, match="already open"):
            DigestSet(tmp_path / "d")
    DigestSet(tmp_path / "d").close()  # released on close


@pytest.mark.parametrize("bad", [b"short", "sha1:tooshort", "zz" * 20, "sha256:" + "a" * 64, "1" * 33])
def test_bad_digests(bad):
    with pytest.raises(ValueError):
        digest_key(bad)


def test_bad_types():
    with pytest.raises(TypeError):
        digest_key(12345)


def test_base32_digests_read_as_base64_reads_them():
    """The one-conversion base32 reader gives b32decode's bytes, in either case, with or without
    the sha1: prefix, and refuses what is not 32 base32 characters."""
    import base64
    import random
    rng = random.Random(7)
    for _ in range(2000):
        raw = rng.randbytes(20)
        text = base64.b32encode(raw).decode()
        assert digest_key(text) == raw
        assert digest_key("sha1:" + text.lower()) == raw
        assert digest_key(f"  SHA1:{text} ") == raw
    for bad in ["0" * 32, "A" * 31 + "1", "A" * 31 + "_", "A_" * 16, "+" + "A" * 31, "\u0661" + "A" * 31,
                "A" * 31 + "\u00e9", "A" * 31 + "="]:
        with pytest.raises(ValueError):
            digest_key(bad)


def _fill(directory, start: int, n: int) -> None:
    """The owner (another process, as the crawl process is to a worker) records digests start..start+n."""
    code = ("import hashlib, sys\n"
            "from crawlerd.store.digest_set import DigestSet\n"
            "start, n = int(sys.argv[2]), int(sys.argv[3])\n"
            "with DigestSet(sys.argv[1]) as ds:\n"
            "    ds.add_many([(hashlib.sha1(str(i).encode()).digest(), f'http://h{i}.test/' + 'p' * 200, 'd')\n"
            "                 for i in range(start, start + n)])\n")
    subprocess.run([sys.executable, "-c", code, str(directory), str(start), str(n)], check=True, timeout=120)


def test_a_view_keeps_reading_after_the_owner_grew_the_file_past_its_map(tmp_path):
    # A read-only view maps what the file held when it opened (LMDB: at least 10 MiB); once the owner
    # commits past that, each read transaction of the view used to fail with MDB_MAP_RESIZED (a worker
    # then archived every page unparsed, outcome process_error, from ~50 k pages of a crawl on)
    _fill(tmp_path / "d", 0, 10)
    view = DigestView(tmp_path / "d")
    try:
        assert view.get(hashlib.sha1(b"3").digest()) == ("http://h3.test/" + "p" * 200, "d")
        _fill(tmp_path / "d", 10, 60_000)            # ~16 MiB of entries
        assert os.path.getsize(tmp_path / "d" / "data.mdb") > 12 << 20
        assert view.get(hashlib.sha1(b"3").digest()) == ("http://h3.test/" + "p" * 200, "d")
        assert view.get(hashlib.sha1(b"60009").digest()) == ("http://h60009.test/" + "p" * 200, "d")
        assert view.get(hashlib.sha1(b"60010").digest()) is None
    finally:
        view.close()
