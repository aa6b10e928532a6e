"""Data dir layout: the shard count is recorded once, a flat one-shard dir is migrated or refused."""

import json
import os

import pytest

from crawlerd import layout
from crawlerd.layout import LayoutError


def test_fresh_dir_records_the_count_and_makes_shard_dirs(tmp_path):
    d = str(tmp_path)
    assert layout.prepare(d, 3) == []
    assert json.load(open(tmp_path / "crawl.json"))["shards"] == 3
    assert all(os.path.isdir(layout.shard_dir(d, i)) for i in range(3))
    assert layout.prepare(d, 3) == []           # idempotent


def test_a_different_count_is_refused_naming_both(tmp_path):
    layout.prepare(str(tmp_path), 2)
    with pytest.raises(LayoutError) as e:
        layout.prepare(str(tmp_path), 4)
    assert "crawl.shards = 2" in str(e.value) and "crawl.shards = 4" in str(e.value)


def test_flat_dir_is_migrated_in_place_with_one_shard(tmp_path):
    (tmp_path / "frontier").mkdir()
    (tmp_path / "frontier" / "data.mdb").write_bytes(b"x")
    (tmp_path / "drum").mkdir()
    (tmp_path / "blocklist-config.json").write_text("[]")
    (tmp_path / "warc").mkdir()                 # shared parts stay where they are
    done = layout.prepare(str(tmp_path), 1)
    assert (tmp_path / "shards" / "0" / "frontier" / "data.mdb").read_bytes() == b"x"
    assert (tmp_path / "shards" / "0" / "blocklist-config.json").exists()
    assert not (tmp_path / "frontier").exists() and (tmp_path / "warc").is_dir()
    assert sum("migrated" in line for line in done) == 3


def test_flat_dir_is_refused_with_more_shards_naming_the_migration(tmp_path):
    (tmp_path / "frontier").mkdir()
    with pytest.raises(LayoutError) as e:
        layout.prepare(str(tmp_path), 2)
    msg = str(e.value)
    assert "crawl.shards=1" in msg and "cannot be repartitioned" in msg
    assert (tmp_path / "frontier").is_dir() and not (tmp_path / "crawl.json").exists()


def test_a_migration_cut_short_resumes(tmp_path):
    (tmp_path / "shards" / "0" / "frontier").mkdir(parents=True)     # renamed before the crash
    (tmp_path / "drum").mkdir()                                      # not yet
    layout.prepare(str(tmp_path), 1)
    assert (tmp_path / "shards" / "0" / "drum").is_dir() and (tmp_path / "crawl.json").exists()


def test_unreadable_crawl_file_is_an_error(tmp_path):
    (tmp_path / "crawl.json").write_text("{nope")
    with pytest.raises(LayoutError):
        layout.prepare(str(tmp_path), 1)


def test_the_default_shard_count_is_one_loop_per_four_cores():
    from crawlerd.layout import auto_shards

    assert [auto_shards(c) for c in (1, 2, 4, 7, 8, 16, 64)] == [1, 1, 1, 1, 2, 4, 16]
