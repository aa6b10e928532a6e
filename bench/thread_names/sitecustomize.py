"""Bench only: name the crawl process's OS threads for bench/e2e_bench.py (``--thread-names``).

Python 3.11 does not give its threads' names to the OS, so /proc/<pid>/task shows ids only. Loaded
by Python at start when this directory is on ``PYTHONPATH`` and ``CRAWLERD_THREAD_NAMES`` names a
directory; does nothing otherwise. Each Python thread, as it starts, appends
``<native id> <name>`` to ``<dir>/threads.<pid>.log`` (one line per thread: no cost while it runs).
It is a ``sitecustomize``: with another hook of that name on ``PYTHONPATH`` (bench/write_counts)
only the first one loads.
"""

import os
import threading

_DIR = os.environ.get("CRAWLERD_THREAD_NAMES")

if _DIR:
    _start = threading.Thread._bootstrap_inner

    def _named(self):
        try:
            with open(os.path.join(_DIR, f"threads.{os.getpid()}.log"), "a") as f:
                f.write(f"{threading.get_native_id()} {self.name}\n")
        except OSError:
            pass
        _start(self)

    threading.Thread._bootstrap_inner = _named
