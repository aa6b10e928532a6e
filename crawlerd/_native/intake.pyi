"""Type stub for the shard intake's native passes (crawlerd/_native/intake.pyx)."""

from collections.abc import Callable
from typing import Any

import numpy as np

def links(links: list[Any], head: bytes, max_len: int, few: int, check: Callable[[str, str], str | None],
          reasons: list[str]) -> tuple[np.ndarray, list[bytes], np.ndarray]: ...
def answers(runs: list[tuple], mark: int, host_key: Callable[[str], str]
            ) -> tuple[list[tuple[int, bytes, int, int, int, str, str]], list[tuple[int, str]], int, int]: ...
