"""Regenerate the broken-segment fixtures: ``.venv/bin/python tests/store/data/make_fixtures.py``.

torn.warc.gz.open          warcinfo + 3 fetches, the last response member cut in half (kill -9 mid-write)
garbage-tail.warc.gz.open  warcinfo + 3 whole fetches, then a gzip header and junk (a torn, unrelated write)
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from tests.store.helpers import det_writer, write_page  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        w = det_writer(d, compressor="zlib", compress_level=6)
        locs = [write_page(w, i, size=300) for i in range(3)]
        w.flush()
        with open(w.current_path, "rb") as f:
            whole = f.read()
    last = locs[-1]
    assert last.offset + last.length == len(whole)
    with open(os.path.join(HERE, "torn.warc.gz.open"), "wb") as f:
        f.write(whole[:last.offset + last.length // 2])
    with open(os.path.join(HERE, "garbage-tail.warc.gz.open"), "wb") as f:
        f.write(whole + b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + b"not deflate at all \x00\xff" * 4)


if __name__ == "__main__":
    main()
