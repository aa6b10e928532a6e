"""Fuzzing budget: one hypothesis profile per run length, chosen by CRAWLERD_FUZZ.

``make test`` runs the bounded profile (a few seconds per target); ``make test-long`` sets
``CRAWLERD_FUZZ=long`` for a run some hundred times longer. Every crash found becomes an
``@example`` on its target, so it is replayed on every run whatever the profile.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("fuzz", max_examples=120, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("fuzz-long", max_examples=5_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PROFILE = "fuzz-long" if os.environ.get("CRAWLERD_FUZZ") == "long" else "fuzz"


def budget(scale: float = 1.0) -> settings:
    """The settings of the chosen profile, ``scale`` times its examples (slow targets < 1)."""
    base = settings.get_profile(PROFILE)
    return settings(base, max_examples=max(10, int(base.max_examples * scale)))
