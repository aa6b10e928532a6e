"""Type stub for the DUST learner's native suspect table (crawlerd/_native/suspects.pyx)."""

import numpy as np

WAYS: int

class ClassTable:
    """Set-associative cache of 64-bit keys (``WAYS`` per row, round-robin replacement)."""

    WAYS: int
    capacity: int
    nbytes: int
    buckets: int

    def __init__(self, entries: int) -> None: ...
    def has_many(self, keys) -> np.ndarray: ...
    def hits(self, keys0, keys1, tag: int) -> bytes: ...
    def add_many(self, keys) -> None: ...
    def admit(self, keys0, keys1, forced, n: int, tag: int) -> list[int]: ...
    def dump(self) -> tuple[bytes, bytes]: ...
