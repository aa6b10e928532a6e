"""A DUST learner over synthetic hosts whose pages an oracle function gives (tests/frontier/test_dust*.py)."""

import gc
import hashlib

from crawlerd.frontier import dust_rules as R
from crawlerd.frontier.dust import DustLearner
from crawlerd.store.writer import WriterError
from crawlerd.url.canonical import fingerprint

H = "http://shop.example"
OPEN: list = []         # the sites the running test made: their learners closed after it (``close_all``)


def digest(content: str) -> bytes:
    return hashlib.sha1(content.encode()).digest()


class Site:
    """A learner and the pages of one or more synthetic hosts; ``content(url)`` is the oracle."""

    def __init__(self, path, content, **kw):
        self.path, self.content, self.kw = path, content, dict(kw)
        self.kw.setdefault("confirmations", 3)
        self.kw.setdefault("sync", False)
        self.learner = DustLearner(path, **self.kw)
        OPEN.append(self)

    def reopen(self):
        self.learner.close()
        self.learner = DustLearner(self.path, **self.kw)
        return self.learner

    def fetch(self, url: str, canonical: str = "", simhash: int = 0):
        """The crawler archived ``url``: tell the learner."""
        host = url.split("/", 3)[0] + "//" + url.split("/", 3)[2]
        return self.learner.observe(url, fingerprint(url), host, digest(self.content(url)), simhash, canonical)

    def admit(self, url: str, depth: int = 1):
        return self.learner.admit(url, fingerprint(url), depth)


def close_all() -> None:
    """Close the learners of the sites the test made (tests/frontier/conftest.py, after each test). A
    store dropped unclosed is freed by the cyclic collector at some later allocation, possibly in
    the middle of another store's LMDB calls (a segfault in a later test's write transaction)."""
    while OPEN:
        site = OPEN.pop()
        learner, site.learner = site.learner, None
        if learner is not None and learner.store.env is not None:
            try:
                learner.close()
            except WriterError:         # commits handed to a writer that stopped: closed all the same
                pass
    gc.collect()


def tracking_content(url: str) -> str:
    """utm_source never matters; everything else is part of the page."""
    p = R.parse(url)
    return R.unparse(R.Parts(p.origin, p.segs, tuple(x for x in p.query if x[0] != "utm_source"),
                             tuple(r for r in p.raw if not r.startswith("utm_source="))))
