"""Type stub for the native packing of BEAST's deferred runs (crawlerd/_native/fiforuns.pyx)."""

def pack_block(hosts: list, i: int, j: int, seq: int, fps: list[int], records: list[bytes], used: int,
               cap: int) -> tuple[bytes, int, int]: ...
