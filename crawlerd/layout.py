"""The data dir's layout: what the shards share, what each shard owns, and the crawl's shard count.

::

    crawl.json          {"shards": N, "layout": 1}: N is fixed for the life of a crawl
    shards/<i>/         shard i's own state: frontier/ drum/ recrawl/ budgets/ dedup/ dust/ robots/
                        dns-cache.jsonl blocklist-config.json, control.sock and dedup.sock (a shard process's)
    handoff/<i>/        batches of URLs other shards (and ``seed add``) handed to shard i
    ipslots             the per-IP slot table the shard processes share (rebuilt at each start)
    warc/ index/        every shard's workers write their own segments (names carry the shard)
    events/             one event log per shard (``events`` for shard 0, ``events_s<i>``)
    lock control.sock last-run.json

A data dir of a crawl made before shards (the shard's state directly under the data dir) is a
one-shard crawl: with ``crawl.shards = 1`` it is migrated in place (each part renamed into
``shards/0/``, then ``crawl.json`` written; a crash in between resumes the renames). With more
shards it is refused: a crawl cannot be repartitioned cheaply, since every queued URL, seen-set
key, budget and recrawl entry would move to the shard its domain hashes to.
"""

from __future__ import annotations

import json
import os

from crawlerd.store.fsync import fsync_dir

CRAWL_FILE = "crawl.json"
LAYOUT_VERSION = 1
# a shard's own state, by name under its directory (the flat layout had them under the data dir)
SHARD_PARTS = ("frontier", "drum", "recrawl", "budgets", "dedup", "dust", "robots", "dns-cache.jsonl",
               "blocklist-config.json")


class LayoutError(Exception):
    """The data dir cannot be used with this shard count; the message says why and what to run."""


class StateFormatError(Exception):
    """A part of the data dir was written in a format this crawlerd does not read (by a newer one);
    the message names the directory and the formats. The daemon does not start on it."""


def shard_dir(data_dir: str, index: int) -> str:
    return os.path.join(data_dir, "shards", str(index))


def handoff_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "handoff")


def outbox_dir(data_dir: str, index: int | None = None) -> str:
    """A cluster's local outbox: shard ``index``'s batches until JetStream holds them
    (``shards/<i>/outbox/<dest>/``), or the supervisor's seeds (``outbox/<dest>/``)."""
    return os.path.join(shard_dir(data_dir, index), "outbox") if index is not None else \
        os.path.join(data_dir, "outbox")


def ipslots_path(data_dir: str) -> str:
    return os.path.join(data_dir, "ipslots")


def shard_socket(data_dir: str, index: int) -> str:
    return os.path.join(shard_dir(data_dir, index), "control.sock")


def dedup_socket(data_dir: str, index: int) -> str:
    """Where shard ``index`` answers claims for the payload digests it owns."""
    return os.path.join(shard_dir(data_dir, index), "dedup.sock")


def events_name(index: int) -> str:
    """The event log name of shard ``index`` (two shards never recover each other's open file)."""
    return "events" if index == 0 else f"events_s{index}"


def stored_shards(data_dir: str) -> int | None:
    """The shard count recorded in ``crawl.json``, or None when there is none yet."""
    path = os.path.join(data_dir, CRAWL_FILE)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return None         # no crawl yet (a data dir that cannot exist is the supervisor's to name)
    except (OSError, ValueError) as e:
        raise LayoutError(f"{path}: unreadable ({e}); it records the crawl's shard count") from None
    n = doc.get("shards") if isinstance(doc, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise LayoutError(f"{path}: no valid \"shards\" count in {doc!r}")
    return n


def auto_shards(cores: int | None = None) -> int:
    """``crawl.shards = 0``: one shard per 4 cores, at least one. A shard's loop is one core at
    saturation and keeps about half a core of processing workers busy (bench/RESULTS.md: loop
    ~1,400-1,700 us, workers ~650-1,200 us of CPU per request at 20,000 hosts), so a shard uses
    about 1.5 cores; the rest is headroom for the merges, the WARC writes and whatever else runs on
    the machine (each shard also costs its own caches, and a hand-off: +25% CPU per request at two).
    The old one per 8 cores left most of a 16-64-core machine idle."""
    return max(1, (cores or os.cpu_count() or 1) // 4)


def resolve_shards(data_dir: str, configured: int) -> int:
    """The shard count of this run: the configured one, else the crawl's recorded one, else a
    flat (pre-shards) crawl's 1, else ``auto_shards()``."""
    if configured > 0:
        return configured
    stored = stored_shards(data_dir)
    if stored is not None:
        return stored
    if any(os.path.exists(os.path.join(data_dir, p)) for p in SHARD_PARTS):
        return 1
    return auto_shards()


def prepare(data_dir: str, shards: int) -> list[str]:
    """Check or record the shard count, migrate a flat one-shard dir, create the shard dirs.

    Returns one line per part migrated (for the log). Raises LayoutError naming both counts on a
    mismatch, and the command that migrates a flat dir when ``shards`` > 1.
    """
    done: list[str] = []
    stored = stored_shards(data_dir)
    flat = [p for p in SHARD_PARTS if os.path.exists(os.path.join(data_dir, p))]
    if stored is not None and stored != shards:
        raise LayoutError(
            f"data dir {data_dir} holds a crawl with crawl.shards = {stored}; this run asks for "
            f"crawl.shards = {shards}. The shard count is fixed for the life of a crawl (URLs, seen-sets "
            f"and budgets are partitioned by it): run with -s crawl.shards={stored}, or start a new crawl "
            f"in another data dir")
    if stored is None and flat:
        if shards != 1:
            raise LayoutError(
                f"data dir {data_dir} holds a one-shard crawl in the layout from before shards ({', '.join(flat)} "
                f"directly under it); it can only go on with one shard: `crawlerd run -s crawl.shards=1 "
                f"--data-dir {data_dir}` migrates it in place to shards/0/. It cannot be repartitioned into "
                f"{shards} shards (every queued URL, seen-set key and budget would move); start a new crawl "
                f"in another data dir for that")
        dest = shard_dir(data_dir, 0)
        os.makedirs(dest, exist_ok=True)
        for part in flat:
            target = os.path.join(dest, part)
            if os.path.exists(target):
                raise LayoutError(f"cannot migrate {os.path.join(data_dir, part)}: {target} exists too; "
                                  f"move one of them away by hand")
            os.rename(os.path.join(data_dir, part), target)
            done.append(f"migrated {part} to shards/0/{part}")
        fsync_dir(dest)
        fsync_dir(data_dir)
    for i in range(shards):
        os.makedirs(shard_dir(data_dir, i), exist_ok=True)
    if stored is None:
        _write_json(os.path.join(data_dir, CRAWL_FILE), {"shards": shards, "layout": LAYOUT_VERSION})
    return done


def _write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")
