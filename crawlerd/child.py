"""Starting a crawlerd child process that imports the very package this process runs.

``python -m crawlerd...`` puts the current directory first on ``sys.path``: started from a
source checkout after a non-editable install, a child would import the checkout's ``crawlerd/``
(whose native modules were never built) and die at import, again and again. A child is started
with ``-P`` (no current directory on its path) and ``PYTHONPATH`` led by the directory holding
this process's own ``crawlerd`` package, so parent and child always run the same code.
"""

from __future__ import annotations

import os
import sys

import crawlerd

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(crawlerd.__file__)))


def python_argv(module: str, *args: str) -> list[str]:
    """``python -P -m module args...`` with this interpreter."""
    return [sys.executable, "-P", "-m", module, *args]


def child_env(extra: dict[str, str] | None = None, *, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment with ``PYTHONPATH`` led by ``PACKAGE_ROOT``; ``drop``: names removed."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != PACKAGE_ROOT]
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, *rest])
    env.update(extra or {})
    return env
