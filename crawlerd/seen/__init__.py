"""The seen-set: has this URL fingerprint been met before?

``drum`` is the disk-bucketed DRUM store (Lee et al., IRLbot §4: check+update
batched into buckets, merged against a sorted key file in one sequential pass)
and its crash recovery; ``drum_files`` its on-disk formats (key file, journal
blocks, results, cursor, manifest, torn tails); ``drum_answers`` the hand-out
and acknowledgement of merged answers in submission order. ``front`` is the
asynchronous front the shard talks to (every DRUM call on one thread, answers
delivered on the loop, acknowledged after the frontier committed them), with
``intake_log`` keeping keys submitted but not yet in DRUM's journal.
"""

from crawlerd.seen.drum import Drum
from crawlerd.seen.drum_answers import DrumResult, answer_runs
from crawlerd.seen.drum_files import DrumCorrupt, DrumError
from crawlerd.seen.front import AsyncSeenSet, SeenSetError

__all__ = ["AsyncSeenSet", "Drum", "DrumCorrupt", "DrumError", "DrumResult", "answer_runs", "SeenSetError"]
