"""The seen-set: has this URL fingerprint been met before?

``drum`` is the disk-bucketed DRUM store (Lee et al., IRLbot §4: check+update
batched into buckets, merged against a sorted key file in one sequential pass),
with its journal and crash recovery; ``front`` is the asynchronous front the
shard talks to (every DRUM call on one thread, answers delivered on the loop,
acknowledged after the frontier committed them).
"""

from crawlerd.seen.drum import Drum, DrumCorrupt, DrumError, DrumResult
from crawlerd.seen.front import AsyncSeenSet, SeenSetError

__all__ = ["AsyncSeenSet", "Drum", "DrumCorrupt", "DrumError", "DrumResult", "SeenSetError"]
