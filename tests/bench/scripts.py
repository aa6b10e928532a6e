"""Import a script of ``bench/`` as a module, the way the bench tests read its functions."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_bench(relpath: str):
    """``bench/<relpath>`` loaded under its file name; its folder joins ``sys.path`` (its own imports)."""
    path = os.path.join(ROOT, "bench", relpath)
    name = os.path.splitext(os.path.basename(path))[0]
    if os.path.dirname(path) not in sys.path:
        sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod          # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod
