"""Type stub for the native block-table kernel (crawlerd/_native/blocktables.pyx); reference: blocktables_ref.py."""

import numpy as np
import numpy.typing as npt

OFFSETS_MIN: int
MAX_MERGE: int

def rotl_array(fps: npt.NDArray[np.uint64], r: int) -> npt.NDArray[np.uint64]: ...
def bucket_offsets(table: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]: ...

class BlockTables:
    """One immutable sorted run of (fingerprint, doc id) pairs with four block tables."""

    fps: npt.NDArray[np.uint64]
    doc_ids: npt.NDArray[np.int64]
    rot1: npt.NDArray[np.uint64]
    rot2: npt.NDArray[np.uint64]
    rot3: npt.NDArray[np.uint64]
    offsets: npt.NDArray[np.int64] | None
    n: int

    def __init__(
        self,
        fps: npt.ArrayLike,
        doc_ids: npt.ArrayLike,
        rot1: npt.ArrayLike,
        rot2: npt.ArrayLike,
        rot3: npt.ArrayLike,
        offsets: npt.ArrayLike | None = None,
    ) -> None: ...
    @staticmethod
    def build(fps: npt.ArrayLike, doc_ids: npt.ArrayLike) -> BlockTables: ...
    def __len__(self) -> int: ...
    def check_invariant(self) -> None: ...
    def query_into(self, q: int, k: int, out: list[tuple[int, int, int]]) -> int: ...
    def query_many_into(self, qs: npt.NDArray[np.uint64], k: int, outs: list[list[tuple[int, int, int]]]) -> int: ...

class BlockTail:
    """The newest pairs, unsorted, up to ``capacity``, with a hash chain per 16-bit block."""

    fps: npt.NDArray[np.uint64]
    doc_ids: npt.NDArray[np.int64]
    n: int
    capacity: int
    nbytes: int

    def __init__(self, capacity: int) -> None: ...
    def __len__(self) -> int: ...
    def add(self, fp: int, doc_id: int) -> bool: ...
    def add_many(self, fps: npt.NDArray[np.uint64], doc_ids: npt.NDArray[np.int64]) -> int: ...
    def clear(self) -> None: ...
    def query_into(self, q: int, k: int, out: list[tuple[int, int, int]]) -> int: ...
    def query_many_into(self, qs: npt.NDArray[np.uint64], k: int, outs: list[list[tuple[int, int, int]]]) -> int: ...

def scan_into(
    fps: npt.NDArray[np.uint64],
    doc_ids: npt.NDArray[np.int64],
    n: int,
    q: int,
    k: int,
    out: list[tuple[int, int, int]],
) -> int: ...
def scan_many_into(
    fps: npt.NDArray[np.uint64],
    doc_ids: npt.NDArray[np.int64],
    n: int,
    qs: npt.NDArray[np.uint64],
    k: int,
    outs: list[list[tuple[int, int, int]]],
) -> int: ...
def merge_tables(a: BlockTables, b: BlockTables) -> BlockTables: ...
def merge_into(
    runs: list[BlockTables],
    fps_out: npt.NDArray[np.uint64],
    docs_out: npt.NDArray[np.int64],
    rot1_out: npt.NDArray[np.uint64],
    rot2_out: npt.NDArray[np.uint64],
    rot3_out: npt.NDArray[np.uint64],
) -> int: ...
