"""Type stub for the native DRUM kernels (crawlerd/_native/drum.pyx); reference: drum_ref.py."""

import numpy as np
import numpy.typing as npt

def hash_words(data: bytes | bytearray | memoryview | npt.NDArray[np.uint8], word0: int = 0) -> int:
    """Checksum: sum of mix64(word + index * K1) over little-endian words, last one zero-padded."""
    ...

def bucket_of(key: int, buckets: int) -> int:
    """Bucket of a key: ((key >> 32) * buckets) >> 32, monotone in the key."""
    ...

def sort_keys(keys: npt.NDArray[np.uint64]) -> list[int]:
    """Stable order of ``keys`` by the merge's radix sort (indices)."""
    ...

def decode_blocks(buf: bytes, value_size: int, unique_in: npt.NDArray[np.uint8],
                  values_in: npt.NDArray[np.uint8], ordinal: int, seq: int,
                  keys_out: npt.NDArray[np.uint64], unique_out: npt.NDArray[np.uint8],
                  values_out: npt.NDArray[np.uint8], out_pos: int) -> tuple[int, int, int]:
    """Answer whole journal blocks into the outputs: (bytes consumed, keys written, ordinals used)."""
    ...

def make_results(keys: npt.NDArray[np.uint64], unique: npt.NDArray[np.uint8], op: object, seq: int, i0: int,
                 i1: int, aux: bytes | None, ends: npt.NDArray[np.int64] | None,
                 values: npt.NDArray[np.uint8] | None, value_size: int) -> list[Result]:
    """Answers i0..i1-1 of one run of a delivery as ``Result`` (aux cut at ``ends``; a duplicate's value)."""
    ...

class Result:
    """One answer handed out, not tracked by the cyclic collector (ints, bytes, None, an Op)."""
    key: int
    op: object
    unique: bool
    value: bytes | None
    aux: bytes | None
    seq: int
    def __init__(self, key: int, op: object, unique: bool, value: bytes | None, aux: bytes | None,
                 seq: int) -> None: ...

class Core:
    """RAM buckets + cache + journal writer + merge pass of one DRUM.

    Bucket key: bucket_of(key); records key | op<<62 | ordinal | value in
    ordinal order (spill file first, then RAM). Cache key: mix64(key) & (sets-1),
    8 ways, most recent first; a cached key is in the set with its current value.
    """

    buckets: int
    value_size: int
    record_size: int
    bucket_records: int
    ordinals: int
    max_bucket_bytes: int
    cache_capacity: int
    cache_hits: int

    def __init__(self, buckets: int, bucket_buffer_bytes: int, value_size: int, cache_entries: int) -> None: ...
    def set_files(self, journal_fd: int, spill_fds: list[int]) -> None: ...
    def spilled_bytes(self, b: int) -> int: ...
    def buffered(self, b: int) -> int: ...
    def cache_lookup(self, key: int) -> tuple[bool, bytes | None]: ...
    def submit(self, keys: npt.NDArray[np.uint64], op: int, values: bytes | None,
               aux_lens: npt.NDArray[np.uint32] | None, aux: bytes | None, first_seq: int) -> int:
        """Journal one call (one write), then bucket its cache misses; returns the cache hits."""
        ...
    def replay(self, keys: npt.NDArray[np.uint64], hit: npt.NDArray[np.uint8], op: int,
               values: npt.NDArray[np.uint8] | None) -> None: ...
    def reset_epoch(self) -> None: ...
    def merge(self, old_fd: int, old_count: int, old_hash: int, new_fd: int,
              unique_out: npt.NDArray[np.uint8], values_out: npt.NDArray[np.uint8]) -> tuple[int, int]:
        """One merge pass over every bucket; returns (new count, new checksum). ValueError on a bad key file."""
        ...
