"""simweb: a synthetic web on loopback for crawlerd's tests, demo and benchmarks.

One HTTP/1.1 server (uvloop) plays many hosts ``h{i}.sim``, each with its own 127.x.y.z address
inside a private network namespace. Content, robots.txt variants and misbehaving hosts (slow,
rate-limited, flaky, traps) are a pure function of a seed (``site.py``, ``pages.py``,
``handler.py``); the server (``server.py``) enters every request in a ledger, and ``ledger.py``
checks a ledger for politeness, robots and Retry-After violations. ``process.py`` runs it in a
subprocess; ``python -m crawlerd.simweb --help`` runs it by hand. ``dns.py`` and ``hostile.py``
(the fetch layer's test servers) live here too.
"""

from crawlerd.simweb.process import SimWebError, SimWebProcess

__all__ = ["SimWebError", "SimWebProcess"]
