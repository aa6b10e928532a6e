"""What the recrawl schedule's tests share: a Recrawl opened with the tests' intervals, a visit
recorded in one call, and a crash (the last reference dropped without close)."""

import gc

from crawlerd.frontier.recrawl import Recrawl

T0 = 1_700_000_000.0          # wall-clock seconds: exercises the ms keys at realistic magnitudes
A = "http://a.test"
KW = dict(initial_interval_s=40.0, min_interval_s=10.0, max_interval_s=320.0, reissue_timeout_s=25.0,
          jitter=0.0, map_size_bytes=1 << 28, sync=False)


def open_rc(path, **kw):
    args = dict(KW)
    args.update(kw)
    return Recrawl(str(path), **args)


def rec(rc, n, t, status=200, digest="d0", etag=None, lm=None, changed=None):
    return rc.record(f"{A}/p{n}", n, A, fetched_at=t, status=status, etag=etag, last_modified=lm,
                     digest=digest, changed=changed)


def crash():
    """Called right after the last reference to a Recrawl was dropped without close(): make sure it is
    gone, its open transaction lost as with kill -9 (LMDB refuses a second open of one env per process)."""
    gc.collect()
