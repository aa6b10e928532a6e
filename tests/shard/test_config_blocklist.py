"""The config file's blocklist across a ``kill -9`` (``Operations.apply_config_blocklist``): the
entries the file gave are remembered in ``blocklist-config.json`` only once the frontier's commit
that applied them is on disk, so an entry deleted from the file is unblocked by the next reload
or restart whatever moment the crash came at."""

import asyncio
import json
import shutil

from crawlerd import config
from crawlerd.shard.operations import CONFIG_BLOCKLIST_FILE, Operations
from crawlerd.store.writer import WriteThread
from tests.frontier.conftest import Harness


def operations(h: Harness, state_dir) -> Operations:
    """The operator side over one frontier: the config blocklist touches nothing else."""
    return Operations(config.load(None), frontier=h.f, seen=None, recrawl=None, digests=None, near=None, pool=None,
                      guard=None, table=None, tasks=None, events=None, metrics=None, state_dir=str(state_dir))


def test_an_entry_removed_from_the_file_is_unblocked_after_a_kill_9_before_its_commit_landed(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    remembered = state / CONFIG_BLOCKLIST_FILE

    async def go():
        h = Harness(str(tmp_path / "f"))
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        h.f.attach_writer(writer)
        ops = operations(h, state)
        ops.apply_config_blocklist(["farm.test"])
        while not remembered.exists():          # written once the block's commit landed
            await asyncio.sleep(0.002)
        assert json.loads(remembered.read_text()) == ["farm.test"] and h.f.blocked() == ["farm.test"]

        writer.hold()                           # the unblock's commit does not land before the crash
        ops.apply_config_blocklist([])
        for _ in range(20):
            await asyncio.sleep(0.002)
        assert h.f.blocked() == []
        assert json.loads(remembered.read_text()) == ["farm.test"]      # not before the commit landed
        shutil.copytree(h.path, tmp_path / "k")                          # kill -9 now
        shutil.copy(remembered, tmp_path / "k.json")
        writer.release()
        for _ in range(200):
            if json.loads(remembered.read_text()) == []:
                break
            await asyncio.sleep(0.002)
        assert json.loads(remembered.read_text()) == []
        h.f.attach_writer(None)
        writer.close()
        h.f.close()
    asyncio.run(go())

    # the restart after that kill -9: the frontier still blocks the entry, the file still names it,
    # and the reload of the file (which no longer has it) unblocks it
    state2 = tmp_path / "state2"
    state2.mkdir()
    shutil.copy(tmp_path / "k.json", state2 / CONFIG_BLOCKLIST_FILE)
    after = Harness(str(tmp_path / "k"))
    assert after.f.blocked() == ["farm.test"]
    operations(after, state2).apply_config_blocklist([])
    assert after.f.blocked() == []
    after.f.close()
