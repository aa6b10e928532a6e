"""Type stub for the native outlink resolver (crawlerd/_native/links.pyx)."""

from collections.abc import Callable
from typing import Any

class LinkResolver:
    def __init__(self, normalize_authority: Callable[[str, str], str | None],
                 normalize: Callable[[str, str], str | None], host_key: Callable[[str], str],
                 remove_dot_segments: Callable[[str], str], link: Callable[..., Any],
                 fingerprint: Callable[[bytes], int]) -> None: ...
    def resolve(self, hrefs: list[tuple[str, bool]], base_url: str, base: Any,
                max_url_length: int) -> list[Any]: ...
