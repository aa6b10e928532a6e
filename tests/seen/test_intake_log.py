"""The seen-set's intake log: a record written with the caller's aux lengths is the record written
without them, byte for byte, and reads back as what was submitted."""

import os

import numpy as np

from crawlerd.seen.intake_log import IntakeWriter, read_intake


def write(path: str, lens) -> tuple[bytes, int]:
    os.makedirs(path)
    w = IntakeWriter(path, 0)
    aux = [b"1 0 1 http://a.example/", b"", b"2 0 1 http://b.example/\xc3\xa9"]
    auxb = w.append(7, np.array([1, 2**64 - 1, 3], dtype=np.uint64), aux, lens=lens)
    seg = w.take_segment()
    with open(seg, "rb") as f:
        data = f.read()
    assert list((k.tolist(), a) for _, k, a in read_intake(seg)) == [([1, 2**64 - 1, 3], aux)]
    return data, auxb


def test_a_record_with_its_lengths_given_is_the_same_record(tmp_path):
    plain = write(str(tmp_path / "a"), None)
    given = write(str(tmp_path / "b"), np.array([23, 0, 25], dtype="<u4"))
    assert given == plain and plain[1] == 48
