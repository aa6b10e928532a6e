"""Pure-Python reference for the block logic of ``crawlerd._native.bodypool`` (same API, same
results, a bytearray instead of a shared memory region).

Blocks are linked through ``links`` (one int per block, -1 ends a chain): the free list in block
order at first, a freed chain spliced onto its head; a body is the chain from its first block.
A writer that cannot take a block moves its body to the heap (a fallback) for the rest of it.
The tests run the same operation sequences against both and compare every number.
"""

from __future__ import annotations

DEF_BLOCK_BYTES = 8192


def layout(size_bytes: int, block_bytes: int) -> tuple[int, int]:
    """(blocks, header bytes): one int32 link per block, the header rounded up to a page."""
    if block_bytes < 64 or block_bytes % 64:
        raise ValueError("block_bytes must be a positive multiple of 64")
    n = size_bytes // (block_bytes + 4)
    header = (n * 4 + 4095) // 4096 * 4096
    while n > 0 and header + n * block_bytes > size_bytes:
        n -= 1
    if n < 1 or n >= (1 << 31) - 1:
        raise ValueError(f"a body pool of {size_bytes} bytes holds no {block_bytes}-byte block")
    return n, header


class RefBodyPool:
    def __init__(self, size_bytes: int, block_bytes: int = DEF_BLOCK_BYTES, name: str = "") -> None:
        self.blocks, self.header = layout(size_bytes, block_bytes)
        self.block_bytes = block_bytes
        self.size = self.header + self.blocks * block_bytes
        self.data = bytearray(self.blocks * block_bytes)
        self.links = [*range(1, self.blocks), -1]
        self.free_head = 0
        self.used = self.high_water = self.bodies = self.fallbacks = self.pooled = 0
        self.closed = False

    @property
    def used_bytes(self) -> int:
        return self.used * self.block_bytes

    @property
    def cap_bytes(self) -> int:
        return self.blocks * self.block_bytes

    @property
    def high_water_bytes(self) -> int:
        return self.high_water * self.block_bytes

    def close(self) -> None:
        self.closed = True

    def take(self) -> int:
        b = self.free_head
        if b >= 0:
            self.free_head = self.links[b]
            self.links[b] = -1
            self.used += 1
            self.high_water = max(self.high_water, self.used)
        return b

    def give_chain(self, first: int) -> None:
        if first < 0 or self.closed:
            return
        b, n = first, 1
        while self.links[b] >= 0:
            b = self.links[b]
            n += 1
        self.links[b] = self.free_head
        self.free_head = first
        self.used -= n

    def chain_bytes(self, first: int, size: int) -> bytes:
        if self.closed:
            raise ValueError("body pool closed")
        out, b, bb = bytearray(), first, self.block_bytes
        while len(out) < size:
            if b < 0:
                raise ValueError("body chain shorter than its size")
            out += self.data[b * bb:b * bb + min(bb, size - len(out))]
            b = self.links[b]
        return bytes(out)

    def put(self, data: bytes) -> RefPooledBody | None:
        data = bytes(data)
        if not data or self.closed:
            return None
        if -(-len(data) // self.block_bytes) > self.blocks - self.used:
            return None
        w = RefBodyWriter(self)
        w(data)
        return w.finish()

    def free_blocks(self) -> int:
        n, b = 0, self.free_head
        while b >= 0:
            n, b = n + 1, self.links[b]
        return n


class RefPooledBody:
    def __init__(self, pool: RefBodyPool, first: int, size: int) -> None:
        self.pool, self.first, self.size = pool, first, size

    def __len__(self) -> int:
        return self.size

    @property
    def released(self) -> bool:
        return self.first < 0

    def read(self) -> bytes:
        if self.first < 0:
            raise ValueError("body released")
        return self.pool.chain_bytes(self.first, self.size)

    def release(self) -> None:
        if self.first >= 0:
            self.pool.give_chain(self.first)
            self.pool.bodies -= 1
            self.first = -1

    __del__ = release


class RefBodyWriter:
    def __init__(self, pool: RefBodyPool) -> None:
        self.pool = pool
        self.first = self.last = -1
        self.fill = self.size = 0
        self.spill: list[bytes] | None = None

    def __len__(self) -> int:
        return self.size

    def __call__(self, chunk: bytes) -> None:
        pool, bb = self.pool, self.pool.block_bytes
        if self.spill is not None or pool.closed:
            self._spill(chunk)
            return
        pos = 0
        while pos < len(chunk):
            room = bb - self.fill if self.last >= 0 else 0
            if room == 0:
                b = pool.take()
                if b < 0:
                    self._to_heap()
                    self._spill(chunk[pos:])
                    return
                if self.last < 0:
                    self.first = b
                    pool.bodies += 1
                else:
                    pool.links[self.last] = b
                self.last, self.fill, room = b, 0, bb
            k = min(room, len(chunk) - pos)
            at = self.last * bb + self.fill
            pool.data[at:at + k] = chunk[pos:pos + k]
            self.fill += k
            self.size += k
            pos += k

    def _spill(self, chunk: bytes) -> None:
        if self.spill is None:
            self.spill = []
        self.spill.append(bytes(chunk))
        self.size += len(chunk)

    def _to_heap(self) -> None:
        self.spill = []
        if self.first >= 0:
            self.spill.append(self.pool.chain_bytes(self.first, self.size))
            self.pool.give_chain(self.first)
            self.pool.bodies -= 1
        self.first = self.last = -1
        self.fill = 0

    def finish(self) -> RefPooledBody | bytes:
        if self.spill is not None:
            out = b"".join(self.spill)
            self.spill = None
            self.size = 0
            self.pool.fallbacks += 1
            return out
        if self.first < 0:
            return b""
        body = RefPooledBody(self.pool, self.first, self.size)
        self.pool.pooled += 1
        self.first = self.last = -1
        self.fill = self.size = 0
        return body

    def clear(self) -> None:
        if self.first >= 0:
            self.pool.give_chain(self.first)
            self.pool.bodies -= 1
        self.first = self.last = -1
        self.fill = self.size = 0
        self.spill = None
