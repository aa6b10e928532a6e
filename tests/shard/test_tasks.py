"""The shard's Tasks and Wake: a task's end wakes the loop's sleep; a timeout ends it otherwise."""

from __future__ import annotations

import asyncio

from crawlerd.shard.tasks import Tasks, Wake


def test_wake_ends_a_sleep_on_set_or_at_its_timeout_and_keeps_no_earlier_set():
    async def run():
        wake = Wake()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        timed_out = await wake.sleep(0.05)
        slept = loop.time() - t0
        loop.call_later(0.01, wake.set)
        t0 = loop.time()
        woken = await wake.sleep(5.0)
        woken_after = loop.time() - t0
        wake.set()                          # nobody sleeps: not kept
        t0 = loop.time()
        again = await wake.sleep(0.05)
        return timed_out, slept, woken, woken_after, again, loop.time() - t0

    timed_out, slept, woken, woken_after, again, slept_again = asyncio.run(run())
    assert timed_out is False and slept >= 0.04
    assert woken is True and woken_after < 1.0
    assert again is False and slept_again >= 0.04


def test_a_task_that_ends_wakes_the_sleeper_and_a_failed_one_is_kept():
    async def run():
        wake = Wake()
        tasks = Tasks(wake.set)

        async def fail():
            await asyncio.sleep(0.01)
            raise ValueError("boom")

        tasks.spawn(fail())
        woken = await wake.sleep(5.0)
        await asyncio.sleep(0)
        return woken, len(tasks), list(tasks.recent_errors)

    woken, running, errors = asyncio.run(run())
    assert woken is True and running == 0
    assert errors == ["ValueError('boom')"]
