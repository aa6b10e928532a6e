"""PageProcessor in-process: outcomes, duplicates, WARC facts; simweb traps against the filter and near-dups."""

from __future__ import annotations

import gzip
import http.client
import os
from collections import Counter, deque

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawlerd.dedup.near import NearDuplicates
from crawlerd.outcome import Outcome
from crawlerd.process.worker import PageProcessor, entity_digest
from crawlerd.records import FetchResult
from crawlerd.store.encoding import payload_digest
from crawlerd.store.warc import WarcWriter
from crawlerd.url.canonical import fingerprint
from crawlerd.url.filter import UrlFilter

T0 = 1_700_000_000.0
PAGE = (b"<html><head><title>t</title>%s</head><body><p>%s</p>"
        b"<a href='/a'>a</a> <a href='b.html' rel='nofollow'>b</a> <a href='mailto:x@y'>m</a></body></html>")


def page(text: bytes = b"some visible words here", head: bytes = b"") -> bytes:
    return PAGE % (head, text)


def response(url: str, body: bytes, *, status: int = 200, headers: list[tuple[str, str]] | None = None,
             ctype: str = "text/html") -> FetchResult:
    hs = [("Content-Type", ctype)] + list(headers or [])
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hs) + "\r\n"
    return FetchResult(url=url, outcome=Outcome.OK, status=status, ip="127.0.0.1", started_at=T0,
                       request_head=b"GET / HTTP/1.1\r\nHost: t.test\r\n\r\n", response_head=head.encode(),
                       body=body, headers=hs)


def records(path: str) -> list:
    out = []
    with open(path, "rb") as f:
        for rec in ArchiveIterator(f):
            out.append((rec.rec_type, rec.rec_headers.get_header("WARC-Target-URI"),
                        dict(rec.rec_headers.headers), rec.content_stream().read()))
    return out


@pytest.fixture
def warc(tmp_path):
    w = WarcWriter(str(tmp_path / "warc"))
    yield w
    w.close()


def processor(warc, **kw) -> PageProcessor:
    return PageProcessor(warc, agent_token="crawlerd", max_decoded_bytes=kw.pop("max_decoded_bytes", 1 << 20),
                         max_links=100, **kw)


def test_html_page_links_digest_simhash(warc):
    pr = processor(warc).process(response("http://t.test/dir/x.html", page()), prior=None)
    assert pr.outcome is Outcome.OK and pr.content_type == "text/html"
    assert [(ln.url, ln.nofollow, ln.host_key) for ln in pr.links] == [
        ("http://t.test/a", False, "http://t.test"), ("http://t.test/dir/b.html", True, "http://t.test")]
    assert pr.links[0].fp == fingerprint("http://t.test/a")
    assert pr.digest == payload_digest(page()) and pr.simhash != 0
    assert (pr.warc_offset, pr.warc_length) != (-1, 0)


def test_a_digest_given_by_the_caller_is_used(warc):
    res = response("http://t.test/d", page())
    given = "sha1:" + "A" * 32
    assert processor(warc).process(res, prior=None, digest=given).digest == given
    assert processor(warc).process(res, prior=None).digest == entity_digest(res) != given


def test_meta_and_header_robots_are_recorded_in_a_metadata_record(warc):
    res = response("http://t.test/n", page(head=b'<meta name="robots" content="noindex">'),
                   headers=[("X-Robots-Tag", "crawlerd: nofollow")])
    pr = processor(warc).process(res, prior=None)
    assert pr.noindex and pr.nofollow and pr.links == []
    warc.close()
    (meta,) = [r for r in records(warc.segments_closed[0]) if r[0] == "metadata"]
    assert meta[1] == "http://t.test/n" and b"robots: noindex, nofollow" in meta[3]


def test_exact_duplicate_is_a_revisit_asked_through_the_callback(warc):
    asked = []

    def digest_seen(digest, url, when):
        asked.append((digest, url, when))
        return ("http://t.test/first", T0 - 10) if url.endswith("copy") else None

    p = processor(warc, digest_seen=digest_seen)
    first = p.process(response("http://t.test/first", page()))
    copy = p.process(response("http://t.test/copy", page()))
    assert first.duplicate_of == "" and copy.duplicate_of == "http://t.test/first"
    assert asked == [(first.digest, "http://t.test/first", T0), (copy.digest, "http://t.test/copy", T0)]
    warc.close()
    revisit = [r for r in records(warc.segments_closed[0]) if r[0] == "revisit"]
    assert len(revisit) == 1 and revisit[0][2]["WARC-Refers-To-Target-URI"] == "http://t.test/first"


def test_near_duplicate_callback_flags_the_page(warc, tmp_path):
    with NearDuplicates(tmp_path / "dedup") as nd:
        p = processor(warc, near_duplicate=lambda fp, url: nd.check_and_add(fp, url, "http://t.test"))
        text = b" ".join(b"word%d" % i for i in range(300))
        a = p.process(response("http://t.test/a", page(text)), prior=None)
        b = p.process(response("http://t.test/b", page(text + b" extra")), prior=None)
    assert a.near_duplicate_of == "" and b.near_duplicate_of == "http://t.test/a"
    warc.close()
    metas = {r[1]: r[3] for r in records(warc.segments_closed[0]) if r[0] == "metadata"}
    assert b"near-duplicate-of: http://t.test/a" in metas["http://t.test/b"]
    assert b"near-duplicate-of" not in metas["http://t.test/a"]


@pytest.mark.parametrize("body,headers,cap,outcome", [
    (gzip.compress(page(b"x" * 5000)), [("Content-Encoding", "gzip")], 1000, Outcome.TOO_LARGE),
    (b"garbage", [("Content-Encoding", "gzip")], 1 << 20, Outcome.BAD_ENCODING),
    (b"5\r\nabc", [("Transfer-Encoding", "chunked")], 1 << 20, Outcome.BAD_RESPONSE),
])
def test_undecodable_bodies_end_in_a_named_outcome_and_are_archived(warc, body, headers, cap, outcome):
    res = response("http://t.test/bad", body, headers=headers)
    pr = processor(warc, max_decoded_bytes=cap).process(res, prior=None)
    assert pr.outcome is outcome and pr.error and pr.links == []
    assert pr.digest == entity_digest(res)
    warc.close()
    (resp,) = [r for r in records(warc.segments_closed[0]) if r[0] == "response"]
    assert resp[1] == "http://t.test/bad"


def test_non_html_and_errors_have_no_links(warc):
    p = processor(warc)
    assert p.process(response("http://t.test/x.txt", page(), ctype="text/plain"), prior=None).links == []
    assert p.process(response("http://t.test/404", page(), status=404), prior=None).links == []


def test_archive_failed_keeps_the_raw_response(warc):
    pr = processor(warc).archive_failed(response("http://t.test/boom", page()), "RuntimeError: boom")
    assert pr.outcome is Outcome.PROCESS_ERROR and pr.error == "RuntimeError: boom"
    warc.close()
    recs = records(warc.segments_closed[0])
    assert [r[0] for r in recs if r[1] == "http://t.test/boom"] == ["request", "response", "metadata"]
    assert b"processing-error: RuntimeError: boom" in recs[-1][3]


# -- traps in simweb: the URL filter caps them, near duplicates flag the session host ---------------------
def fetch(conn: http.client.HTTPConnection, authority: str, url: str) -> FetchResult:
    path = url.split(authority, 1)[1] or "/"
    conn.request("GET", path, headers={"Host": authority, "User-Agent": "crawlerd-test"})
    resp = conn.getresponse()
    body = resp.read()      # http.client removes chunked framing; no gzip was asked for
    headers = [(k, v) for k, v in resp.getheaders() if k.lower() != "transfer-encoding"]
    head = f"HTTP/1.1 {resp.status} {resp.reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return FetchResult(url=url, outcome=Outcome.OK, status=resp.status, ip="127.0.0.1", started_at=T0,
                       request_head=b"GET " + path.encode() + b" HTTP/1.1\r\n\r\n", response_head=head.encode(),
                       body=body, headers=headers)


def crawl_host(sim, host: str, entry: str, tmp_path, *, max_param_values: int, budget: int):
    """Breadth-first over one host's links through process -> UrlFilter -> seen set; bounded by ``budget``."""
    authority = f"{host}:{sim.port}"
    conn = http.client.HTTPConnection(sim.static_hosts[host], sim.port, timeout=10)
    uf = UrlFilter(max_param_values=max_param_values)
    start = f"http://{authority}{entry}"
    seen, queue, fetched = {start}, deque([start]), 0
    demoted = 0
    with WarcWriter(str(tmp_path / f"warc-{host}-{max_param_values}")) as warc, \
            NearDuplicates(tmp_path / f"dedup-{host}-{max_param_values}", demote_min_pages=20) as nd:
        p = processor(warc)
        while queue and fetched < budget:
            url = queue.popleft()
            res = fetch(conn, authority, url)
            fetched += 1
            pr = p.process(res, prior=None)
            if pr.simhash:
                nd.check_and_add(pr.simhash, url, f"http://{authority}")
                demoted += nd.should_demote(f"http://{authority}")
            for ln in pr.links:
                if ln.host_key == f"http://{authority}" and not ln.nofollow and ln.url not in seen \
                        and uf.check(ln.url) is None:
                    seen.add(ln.url)
                    queue.append(ln.url)
        counts = nd.host_counts(f"http://{authority}")
    conn.close()
    return {"fetched": fetched, "drained": not queue, "seen": seen, "drops": uf.drops, "near": counts,
            "demoted": demoted}


@pytest.fixture(scope="module")
def sim():
    from crawlerd.simweb import SimWebProcess
    with SimWebProcess(hosts=30, seed=1, min_pages=20, max_pages=20, stderr=open(os.devnull, "w")) as s:
        yield s


def trap_host(sim, role: str) -> str:
    (name,) = [h for h, spec in sim.site()["hosts"].items() if spec["role"] == role]
    return name


def test_calendar_trap_stops_growing_at_its_cap(sim, tmp_path):
    host = trap_host(sim, "trap_calendar")
    capped = crawl_host(sim, host, "/cal?y=2026&m=11", tmp_path, max_param_values=4, budget=400)
    assert capped["drained"], "the calendar kept growing past its cap"
    cal = [u for u in capped["seen"] if "/cal?" in u]
    years = Counter(u.split("y=")[1].split("&")[0] for u in cal)
    assert len(years) <= 4 and len(cal) <= 4 * 12
    assert capped["drops"]["param_values"] > 0
    assert capped["demoted"] == 0           # distinct months are distinct text
    # without the cap the same walk does not end: the trap is real
    uncapped = crawl_host(sim, host, "/cal?y=2026&m=11", tmp_path, max_param_values=10**6, budget=len(cal) + 20)
    assert not uncapped["drained"] and uncapped["fetched"] == len(cal) + 20


def test_session_trap_stops_growing_and_is_demoted_as_near_duplicates(sim, tmp_path):
    host = trap_host(sim, "trap_session")
    pages = sim.site()["hosts"][host]["pages"]
    capped = crawl_host(sim, host, "/", tmp_path, max_param_values=3, budget=600)
    assert capped["drained"], "the session host kept growing past its cap"
    sid_urls = [u for u in capped["seen"] if "?sid=" in u]
    per_path = Counter(u.split("?")[0] for u in sid_urls)
    assert per_path and max(per_path.values()) <= 3 and len(per_path) <= pages
    assert capped["drops"]["param_values"] > 0
    near = capped["near"]
    # every sid page but the first of each path is the same text again: a near duplicate
    assert near["near_duplicates"] >= len(sid_urls) - len(per_path) > 0
    assert capped["demoted"] >= 1


_FAULTS_SCRIPT = r"""
import resource, sys
from crawlerd.process.html import extract
from crawlerd.process.worker import tune_allocator
if sys.argv[1] == "tuned":
    assert tune_allocator()
pages = [("<html><body>" + "".join(f"<div><p>word{i} {j} <a href='/p{j}'>l</a></p></div>" for j in range(600))
          + "</body></html>").encode() for i in range(20)]
for p in pages:
    extract(p, "http://t.test/")
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    for p in pages:
        extract(p, "http://t.test/")
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 100)
"""


@pytest.mark.skipif(not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"), reason="glibc only")
def test_tuned_allocator_keeps_parser_memory_between_pages():
    # Untuned, glibc hands lexbor's per-page blocks back to the kernel and faults them in again
    # on every page (~10 faults a page); tuned, a page in steady state takes no new pages.
    import subprocess
    import sys
    faults = float(subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT, "tuned"], capture_output=True, text=True,
                                  check=True, timeout=60).stdout)
    assert faults < 1.0


def test_declared_canonical_from_the_page_or_the_link_header(warc):
    p = processor(warc)
    pr = p.process(response("http://t.test/a.html?view=print", page(head=b'<link rel="canonical" href="/a.html">')),
                   prior=None)
    assert pr.canonical == "http://t.test/a.html"
    pr = p.process(response("http://t.test/doc.pdf", b"%PDF-1.4", ctype="application/pdf",
                            headers=[("Link", '<http://t.test/doc>; rel="canonical"')]), prior=None)
    assert pr.canonical == "http://t.test/doc"
    assert p.process(response("http://t.test/b.html", page()), prior=None).canonical == ""
