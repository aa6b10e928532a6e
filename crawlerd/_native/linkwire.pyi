"""Type stub for the links' wire record (crawlerd/_native/linkwire.pyx)."""

from typing import Any

from crawlerd._native.linkrec import Link

def pack(links: list[Link], hosts: dict[Any, int]) -> bytes: ...
def unpack(rec: object, hosts: list[Any]) -> list[Link]: ...
