"""The DUST state cache's byte charge (``dust_hosts.host_state_bytes``) against the bytes its states
really hold (tracemalloc, ``bench/dust_state_bytes.py``): within 25 % on plain hosts and on hosts
with URL variants and learned rules, early in a crawl and with full evidence windows."""

import tempfile

import pytest

from crawlerd.frontier.dust import DustLearner
from tests.bench.scripts import load_bench

B = load_bench("dust_state_bytes.py")


@pytest.mark.parametrize("variant_share, pages", [(0.0, 3), (0.0, 24), (1.0, 4), (1.0, 24)])
def test_the_charge_is_within_a_quarter_of_what_the_states_hold(variant_share, pages):
    m = B.measure(120, pages, variant_share)
    assert m["states"] == 119 and m["real_bytes"] > 0, m
    assert 0.75 <= m["charged_bytes"] / m["real_bytes"] <= 1.25, m


def test_hosts_with_variants_learn_rules_and_parse_urls():
    """The replay is the workload the charge is measured on: variant hosts must learn and parse."""
    with tempfile.TemporaryDirectory() as d:
        learner = DustLearner(d, sync=False)
        B.replay(learner, 60, 12, 1.0)
        sts = [learner.hosts.state(f"http://h{i}.sim:{B.PORT}") for i in range(1, 60)]
        assert sum(len(st.rules) for st in sts) > 30
        assert sum(st.window_counts()[2] for st in sts) > 200
        learner.close()
