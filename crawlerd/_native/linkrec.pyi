"""Type stub for the native outlink record (crawlerd/_native/linkrec.pyx)."""

from typing import Any, ClassVar

class Link:
    __match_args__: ClassVar[tuple[str, ...]]
    url: str
    fp: int
    host_key: str
    nofollow: bool
    def __init__(self, url: str, fp: int, host_key: str, nofollow: bool = False) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    def __reduce__(self) -> tuple[Any, ...]: ...

def followed(links: list[Link]) -> tuple[list[Link], set[str]]: ...
