import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def idle_crawlerd(tmp_path_factory):
    """One real daemon with no seeds (it fetches nothing) and its metrics endpoint on a free loopback
    port, shared by the operator's-view tests: yields (data dir, first status)."""
    from tests.idle_daemon import idle_daemon
    data = str(tmp_path_factory.mktemp("idle") / "data")
    with idle_daemon(data, "-s", 'metrics.listen="127.0.0.1:0"') as status:
        yield data, status
