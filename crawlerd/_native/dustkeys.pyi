"""Type stub for the DUST learner's native admission keys (crawlerd/_native/dustkeys.pyx)."""

from collections.abc import Sequence

MAX_VIEW_TOKEN: int

def scan(urls: Sequence[str], fps: Sequence[int], depths: Sequence[int], hops: Sequence[int], hosts: Sequence[str],
         start: int, info: dict, lookup: bool, marks: tuple[str, ...], defer: bool, keys0, keys1, forced, idx,
         m: int) -> tuple[int, int]: ...
def keys(url: str, fp: int, relevant: frozenset[str]) -> tuple[int, int]: ...
