"""robots.txt per RFC 9309: parse once, match fast, decide what a fetch of it means, cache it.

One concept per module:

- ``paths``: the path of a URL and the percent-encoding rules and paths are compared in
  (§2.2.2, §2.2.3 special characters);
- ``parser``: lines to the rules of the group that applies to a product token (§2.2.1);
- ``rules``: :class:`RobotsRules`, those rules compiled, ``allowed(url)`` (longest match wins);
- ``policy``: :func:`robots_decision` maps a fetch of ``/robots.txt`` (status, body, redirect)
  to a :class:`RobotsEntry` or a :class:`RobotsFollow` (§2.3.1, §2.4), with the clock injected;
- ``cache``: :class:`RobotsCache`, entries per host key, bounded in bytes, least recently used out first.
"""

from crawlerd.fetch.robots.cache import RobotsCache, entry_bytes
from crawlerd.fetch.robots.paths import normalize_path, path_of
from crawlerd.fetch.robots.policy import RobotsEntry, RobotsFollow, RobotsState, robots_decision
from crawlerd.fetch.robots.rules import RobotsRules, check_lines

__all__ = [
    "RobotsCache", "RobotsEntry", "RobotsFollow", "RobotsRules", "RobotsState",
    "check_lines", "entry_bytes", "normalize_path", "path_of", "robots_decision",
]
