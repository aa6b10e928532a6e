"""Workers import the package the crawl runs (never a crawlerd/ in the cwd); a broken start stops the pool."""

from __future__ import annotations

import asyncio
import sys

import pytest

from crawlerd.process import pool as poolmod
from crawlerd.process.pool import PoolFailed, WorkerPool
from crawlerd.process.restart import MAX_START_DEATHS
from tests.process.test_pool import init_for, page_html, response, wait_until


def test_workers_ignore_a_crawlerd_folder_in_the_current_directory(tmp_path, monkeypatch):
    # a source checkout whose native modules were never built, as the cwd of `crawlerd run`
    fake = tmp_path / "checkout" / "crawlerd"
    (fake / "process").mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('the checkout, not the installed package')\n")
    (fake / "process" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path / "checkout")

    async def go():
        pool = WorkerPool(1, init_for(tmp_path))
        await pool.start()
        try:
            return await asyncio.wait_for(pool.process(response("http://a.test/", page_html(1))), 30)
        finally:
            await pool.close()

    pr = asyncio.run(go())
    assert pr.warc_file and pr.links


def test_workers_dying_at_start_fail_the_pool_instead_of_looping(tmp_path, monkeypatch):
    spawned = []

    def broken(module, *args):
        spawned.append(module)
        return [sys.executable, "-c", "import sys; sys.exit(3)"]     # dies before reading a frame

    monkeypatch.setattr(poolmod, "python_argv", broken)

    async def go():
        pool = WorkerPool(1, init_for(tmp_path))
        await pool.start()
        job = asyncio.ensure_future(pool.process(response("http://a.test/", page_html(1))))
        try:
            await wait_until(lambda: pool.failed, "the pool to give up", rounds=4000)
            with pytest.raises(PoolFailed, match="dying at start"):
                pool.raise_if_failed()
            n = len(spawned)
            await asyncio.sleep(0.5)
            assert len(spawned) == n == MAX_START_DEATHS       # not started again
            assert not job.done()        # the job is not answered as if processed: its lease is retried
        finally:
            job.cancel()
            await pool.close(timeout_s=1.0)

    asyncio.run(go())
