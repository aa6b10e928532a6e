"""The crawl process's background threads and their CPU scheduling policy (crawlerd.sched)."""

from __future__ import annotations

import asyncio
import os

import pytest

from crawlerd import sched
from crawlerd.store.writer import WriteThread

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this platform")


def policy_of(thread) -> int:
    return os.sched_getscheduler(thread.native_id)


@pytest.fixture
def restore_batch():
    yield
    sched.set_background_batch(True)


@pytest.mark.parametrize("batch", [True, False])
def test_a_background_thread_runs_under_sched_batch_only_when_asked(restore_batch, batch):
    sched.set_background_batch(batch)
    caller = os.sched_getscheduler(0)
    seen = []
    t = sched.background_thread(lambda: seen.append(os.sched_getscheduler(0)), "probe")
    t.start()
    t.join(timeout=5)
    assert t.daemon and t.name == "probe"
    assert seen == [os.SCHED_BATCH if batch else caller]
    assert os.sched_getscheduler(0) == caller      # the caller (the loop's thread) keeps its policy


@pytest.mark.parametrize("batch", [True, False])
def test_the_writer_thread_takes_the_policy_set_before_it_starts(restore_batch, batch):
    async def run():
        loop = asyncio.get_running_loop()
        writer = WriteThread(loop)
        try:
            done = loop.create_future()
            writer.barrier(lambda: done.set_result(None))      # the thread ran (and set its policy)
            await asyncio.wait_for(done, 5)
            return policy_of(writer._thread)
        finally:
            writer.close()

    sched.set_background_batch(batch)
    expected = os.SCHED_BATCH if batch else os.sched_getscheduler(0)
    assert asyncio.run(run()) == expected
