"""CDXJ: SURT keys and lines equal to cdxj-indexer's, sorted files, offsets that point at the record."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
import surt as surt_package
from hypothesis import given, settings
from hypothesis import strategies as st
from warcio.archiveiterator import ArchiveIterator

from crawlerd.store import linesort
from crawlerd.store.cdxj import Capture, cdxj_path, index, surt, timestamp14
from crawlerd.store.verify import verify
from tests.store.helpers import REQUEST_HEAD, RESPONSE_HEAD, T0, all_kinds_segment, det_writer


@pytest.mark.parametrize("url,key", [
    ("http://www.Example.com/a/B?z=1&a=2#frag", "com,example)/a/b?a=2&z=1"),
    ("https://example.com", "com,example)/"),
    ("http://example.com:80/x", "com,example)/x"),
    ("https://example.com:443/x", "com,example)/x"),
    ("http://example.com:8080/x", "com,example:8080)/x"),
    ("http://www2.sub.example.co.uk/", "uk,co,example,sub)/"),
    ("http://127.0.0.1:8000/p", "1,0,0,127:8000)/p"),          # IPv4 octets are reversed too
    ("http://2130706433/", "1,0,0,127)/"),                     # numeric hosts become dotted quads
    ("http://[::1]:8080/a", "::1:8080)/a"),
    ("http://example.com./", "com,example)/"),
    ("http://user:pw@example.com/a/./b/../c//d/", "com,example)/a/c/d"),
    ("http://example.com/p?jsessionid=0123456789abcdef0123456789abcdef&b=1", "com,example)/p?b=1"),
    ("http://example.com/%7Ea%20b?Q=%41", "com,example)/~a%20b?q=a"),
    ("http://example.com:notaport/", "http://example.com:notaport/"),   # unparsable: keyed as itself
])
def test_surt(url, key):
    assert surt(url) == key
    assert surt(url) == _reference_surt(url)


def _reference_surt(url: str) -> str:
    """What cdxj-indexer keys a URL as (the surt package; a URL it cannot parse keys as itself)."""
    try:
        return surt_package.surt(url)
    except Exception:
        return url


_HOSTS = st.sampled_from(["example.com", "www.Example.COM", "www3.a.b.example.co.uk", "127.0.0.1", "10.1.2.3",
                          "2130706433", "0177.0.0.1", "[::1]", "[2001:db8::1]", "h..x.org.", "münchen.de",
                          "xn--mnchen-3ya.de", "a%2eb.com", "sub.WWW.example.com", "1.2.3", "999.1.1.1"])
_PIECE = st.text(alphabet="aB0/._-~%2fFE7e?&=;#+! :()@[]ü", max_size=16)


@settings(max_examples=400, deadline=None)
@given(scheme=st.sampled_from(["http", "https", "HTTP", "ftp"]), host=_HOSTS,
       port=st.sampled_from(["", ":80", ":443", ":8080", ":0", ":"]), path=_PIECE, query=_PIECE, frag=_PIECE)
def test_surt_equals_the_surt_package(scheme, host, port, path, query, frag):
    url = f"{scheme}://{host}{port}/{path}"
    for u in (url, f"{url}?{query}", f"{url}?{query}#{frag}", f"{host}/{path}"):
        assert surt(u) == _reference_surt(u), u


_LABEL = st.text(alphabet="abwz019-", min_size=1, max_size=6)
_PLAIN_PIECE = st.text(alphabet="aZ09-._~!$&'*+,;=:@/?sidSESSIONcf", max_size=20)


@settings(max_examples=400, deadline=None)
@given(scheme=st.sampled_from(["http", "https"]), labels=st.lists(_LABEL, min_size=1, max_size=4),
       port=st.sampled_from(["", ":80", ":443", ":8080", ":0", ":00080", ":99999"]), path=_PLAIN_PIECE,
       query=_PLAIN_PIECE)
def test_surt_of_plain_urls_equals_the_surt_package(scheme, labels, port, path, query):
    """Plain URLs (what a crawl mostly archives) take surt's short path: same key as the general one."""
    url = f"{scheme}://{'.'.join(labels)}{port}/{path}"
    for u in (url, f"{url}?{query}", f"{scheme}://{'.'.join(labels)}?{query}"):
        assert surt(u) == _reference_surt(u), u


def test_timestamp14():
    assert timestamp14("2023-11-14T22:13:20.123456Z") == "20231114221320"
    assert timestamp14("2023-11-14T22:13:20Z") == "20231114221320"


def parse(line: str) -> tuple[str, str, dict]:
    key, stamp, js = line.split(" ", 2)
    return key, stamp, json.loads(js)


def cdxj_indexer(*paths) -> list[str]:
    """The lines pywb's indexer writes for the segments (``cdxj-indexer --sort``), run as users run it."""
    out = subprocess.run([sys.executable, "-m", "cdxj_indexer.main", "--sort", *paths], capture_output=True,
                         text=True, check=True, timeout=120)
    return out.stdout.splitlines()


def test_index_equals_cdxj_indexer_on_every_record_kind(tmp_path):
    path, caps = all_kinds_segment(tmp_path)
    ours = index(path)
    theirs = cdxj_indexer(path)
    assert ours == theirs
    assert len(ours) == len(caps)       # responses and revisits; request, metadata, warcinfo are not indexed
    with open(cdxj_path(path)) as f:    # the file written at close is the same
        assert f.read().splitlines() == theirs
    by_url = {}
    for line in ours:
        _, _, fields = parse(line)
        by_url.setdefault(fields["url"], []).append(fields)
    assert {f["mime"] for f in by_url["http://www.Example.com/a?b=2&a=1"]} == {"Text/HTML", "warc/revisit"}
    assert "mime" not in by_url["http://example.org/missing"][0]                 # no Content-Type header
    assert all(f["digest"].startswith("sha1:") for fs in by_url.values() for f in fs)
    not_modified = [f for f in by_url["http://www.Example.com/a?b=2&a=1"] if f["mime"] == "warc/revisit"][0]
    assert "status" not in not_modified         # no HTTP head in a server-not-modified revisit
    assert not_modified["digest"] == by_url["http://www.Example.com/a?b=2&a=1"][0]["digest"]
    assert verify(path).ok


def test_offsets_point_at_the_record(tmp_path):
    path, caps = all_kinds_segment(tmp_path)
    with open(path, "rb") as f:
        for line in index(path):
            _, stamp, fields = parse(line)
            assert fields["filename"] == os.path.basename(path)
            f.seek(int(fields["offset"]))
            member = f.read(int(fields["length"]))
            rec = next(iter(ArchiveIterator(io.BytesIO(member))))
            assert rec.rec_headers.get_header("WARC-Target-URI") == fields["url"]
            assert rec.rec_headers.get_header("WARC-Payload-Digest") == fields["digest"]
            assert rec.rec_type in ("response", "revisit")


def test_writer_sorts_the_index_with_a_small_buffer(tmp_path):
    """A segment closed with a sort buffer far below its index's size still gets the same file."""
    w = det_writer(tmp_path / "small", index_sort_buffer_bytes=1)
    for i in range(60):
        body = b"<p>%d</p>" % i
        w.write_fetch(url=f"http://h{(i * 37) % 11}.example/p{i}", fetched_at=T0 + i, ip="127.0.0.1",
                      request_head=REQUEST_HEAD, response_head=RESPONSE_HEAD % len(body), body=body)
    w.close()
    path = w.segments_closed[0]
    with open(cdxj_path(path)) as f:
        assert f.read().splitlines() == index(path) == cdxj_indexer(path)
    assert not [n for n in os.listdir(tmp_path / "small") if n.endswith((".run", ".tmp", ".open"))]


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.binary(min_size=1, max_size=12).map(lambda b: b.replace(b"\n", b"n")), max_size=300),
       buffer=st.integers(1, 400), fan_in=st.integers(2, 5))
def test_linesort_is_sorted_unique_whatever_the_buffer(tmp_path_factory, lines, buffer, fan_in):
    d = tmp_path_factory.mktemp("sort")
    out = str(d / "out")
    n = linesort.sort_lines(iter(lines), out, buffer_bytes=buffer, fan_in=fan_in)
    with open(out, "rb") as f:
        got = f.read().split(b"\n")[:-1] if lines else f.read().split(b"\n")[:-1]
    assert got == sorted(set(lines)) and n == len(got)
    assert os.listdir(d) == ["out"]             # runs and the temp name are gone


def _dumps_line(cap) -> str:
    """The line as json.dumps writes it: what Capture.line() must equal byte for byte."""
    fields = {"url": cap.url}
    for name in ("mime", "status", "digest"):
        if getattr(cap, name) is not None:
            fields[name] = getattr(cap, name)
    fields.update(length=str(cap.length), offset=str(cap.offset), filename=cap.filename)
    return f"{surt(cap.url)} {timestamp14(cap.warc_date)} {json.dumps(fields)}"


@settings(max_examples=300, deadline=None)
@given(url=st.text(max_size=60), mime=st.none() | st.text(max_size=20), status=st.none() | st.text(max_size=4),
       digest=st.none() | st.text(max_size=40), length=st.integers(0, 2**40), offset=st.integers(0, 2**40),
       filename=st.text(max_size=30))
def test_capture_line_equals_json_dumps(url, mime, status, digest, length, offset, filename):
    cap = Capture(url="http://example.com/" + url, warc_date="2023-11-14T22:13:20.123456Z", mime=mime,
                  status=status, digest=digest, length=length, offset=offset, filename=filename)
    assert cap.line() == _dumps_line(cap)


def _segment_of(w, pages: int) -> None:
    for i in range(pages):
        body = b"<p>%d</p>" % i
        w.write_fetch(url=f"http://h{(i * 37) % 11}.example/p{i}/" + "x" * 200, fetched_at=T0 + i, ip="127.0.0.1",
                      request_head=REQUEST_HEAD, response_head=RESPONSE_HEAD % len(body), body=body)


def test_a_writer_that_sorts_in_a_child_writes_the_same_index_and_holds_none_of_its_lines(tmp_path):
    """A long-lived writer (a worker's) sorts a closed segment's index in a child process: the same
    file, and the lines never become this process's Python objects (their swing would raise its
    arena high-water mark: bench/RESULTS.md, mem14)."""
    import tracemalloc
    got, peaks = {}, {}
    for child in (False, True):
        w = det_writer(tmp_path / str(child), index_sort_in_child=child)
        _segment_of(w, 3000)
        tracemalloc.start()
        try:
            w.close()
            peaks[child] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        path = w.segments_closed[0]
        sidecar = os.path.getsize(cdxj_path(path))      # the lines sorted: ~1 MB
        with open(cdxj_path(path)) as f:
            got[child] = f.read().splitlines()
        assert got[child] == index(path)
        assert not [n for n in os.listdir(tmp_path / str(child)) if n.endswith((".run", ".tmp", ".open"))]
    assert len(got[True]) == 3000
    assert peaks[False] > sidecar               # in process: every line was an object at once
    assert peaks[True] < sidecar / 10           # in the child: none of them here


def test_a_sort_in_a_child_fails_as_one_in_process_would(tmp_path):
    with pytest.raises(FileNotFoundError):
        linesort.sort_file_in_child(str(tmp_path / "missing"), str(tmp_path / "out"))
    src = tmp_path / "src"
    src.write_bytes(b"b\na\nb\n")
    assert linesort.sort_file_in_child(str(src), str(tmp_path / "out")) == 2
    assert (tmp_path / "out").read_bytes() == b"a\nb\n"


def test_two_writers_of_one_index_at_once_both_succeed(tmp_path):
    """A killed worker's sort child may still be writing a segment's index while the crawl process's
    recovery writes it too: each writes its own temporary file, so neither renames the other's away."""
    import threading
    path = str(tmp_path / "seg.cdxj")
    inner_error: list[BaseException] = []

    def other_writer():
        try:
            linesort.write_sorted(iter([b"a", b"b"]), path)
        except BaseException as e:      # re-raised by the assertion below
            inner_error.append(e)

    def lines_with_a_rival_midway():
        yield b"a"
        rival = threading.Thread(target=other_writer)
        rival.start()                   # it writes and renames the whole index while this one is open
        rival.join()
        yield b"b"

    assert linesort.write_sorted(lines_with_a_rival_midway(), path) == 2
    assert not inner_error
    assert open(path, "rb").read() == b"a\nb\n"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_a_sort_child_dies_with_the_process_that_started_it(tmp_path):
    """kill -9 of a worker while its child sorts: the child does not live on to finish the index."""
    import signal
    import time
    src = tmp_path / "lines.fifo"
    os.mkfifo(src)                      # the child blocks reading it: a sort that is still running
    parent = subprocess.Popen([sys.executable, "-c",
                               "import sys; from crawlerd.store import linesort; "
                               "linesort.sort_file_in_child(sys.argv[1], sys.argv[2])",
                               str(src), str(tmp_path / "out.cdxj")])

    def children() -> list[int]:
        pids = []
        for task in os.listdir(f"/proc/{parent.pid}/task"):
            with open(f"/proc/{parent.pid}/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
        return pids

    def gone(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except FileNotFoundError:
            return True

    try:
        deadline = time.monotonic() + 30
        kids: list[int] = []
        while not kids and time.monotonic() < deadline:
            kids = children()
            time.sleep(0.05)
        assert kids, "the sort child never started"
        time.sleep(1.0)                 # past its start-up: the child is blocked in the sort itself
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        while not all(gone(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(gone(k) for k in kids), "the sort child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        try:                            # a child still blocked would read EOF and end
            fd = os.open(src, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass
