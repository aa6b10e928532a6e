"""A worker's own captures (first captures it archived, not yet in the digest set): bounded in bytes."""

from crawlerd.outcome import Outcome
from crawlerd.process.worker_process import OwnCaptures
from crawlerd.records import ProcessResult


def archived(caps: OwnCaptures, i: int) -> str:
    digest = f"sha1:{i:032d}"
    pr = ProcessResult(url=f"http://h{i % 50}.test/page/{i}", outcome=Outcome.OK,
                       warc_record_id=f"<urn:uuid:{i:08d}-0000-4000-8000-000000000000>")
    caps.archived(digest, pr, 1000.0 + i)
    return digest


def test_own_captures_stay_within_their_bytes_newest_kept():
    caps = OwnCaptures("", cap_bytes=64 << 10)
    digests = [archived(caps, i) for i in range(5000)]
    mem = caps.memory()
    assert 0 < mem["bytes"] <= mem["cap_bytes"] == 64 << 10
    assert mem["entries"] < 5000 and mem["evictions"] == 5000 - mem["entries"]
    hit = caps.owner(digests[-1])
    assert hit is not None and hit.url == "http://h49.test/page/4999" and hit.fetched_at == 5999.0
    assert hit.record_id.startswith("<urn:uuid:00004999")
    assert caps.owner(digests[0]) is None          # the oldest went first (and no digest set here)


def test_forget_only_the_capture_of_that_url():
    caps = OwnCaptures("", cap_bytes=1 << 20)
    d = archived(caps, 7)
    caps.forget(d, "http://other.test/")
    assert caps.owner(d) is not None
    caps.forget(d, "http://h7.test/page/7")
    assert caps.owner(d) is None and caps.memory()["bytes"] == 0
