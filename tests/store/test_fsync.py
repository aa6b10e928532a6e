"""``write_all``: every byte of every part, in order, past the buffers one writev takes."""

import os

from crawlerd.store.fsync import IOV_MAX, write_all


def test_more_parts_than_one_writev_takes_are_written_whole_and_in_order(tmp_path):
    parts = [b"line %d\n" % i for i in range(3 * IOV_MAX + 17)] + [b"", b"end"]
    path = tmp_path / "out"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        write_all(fd, parts)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(parts)

