"""simhash: native and reference agree bit for bit; near-identical texts stay close."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd._native import simhash as native
from crawlerd._native import simhash_ref as ref

IMPLS = [native, ref]

# Letters, digits, separators and a few tricky code points: combining marks, the
# dotted capital I (lowercases to two code points), the Kelvin sign (lowercases to
# ASCII), CJK, astral digits, underscore (not a word character).
ALPHABET = st.sampled_from(
    list("abcXYZ019 \t\n.,;-_'\"é") + ["İ", "K", "ß", "Σ", "字", "\u0301", "\U0001d7d8", "\u00a0", "Ⅻ", "\ufffd"]
)


@pytest.mark.parametrize("impl", IMPLS, ids=["native", "ref"])
class TestSimhash:
    def test_known_values_and_edges(self, impl):
        assert impl.simhash("") == 0
        assert impl.simhash(" ,.;-- _ ") == 0
        # one or two words form a single shingle: the fingerprint is that shingle's hash
        assert impl.simhash("Hello") == ref.shingle_hash(b"hello")
        assert impl.simhash("Hello,  WORLD!") == ref.shingle_hash(b"hello world")
        # case and punctuation do not matter, word boundaries do
        assert impl.simhash("The quick brown fox") == impl.simhash("the QUICK, brown... fox!")
        assert impl.simhash("the quick brown fox") != impl.simhash("thequick brown fox")
        assert impl.simhash("snake_case word here") == impl.simhash("snake case word here")

    def test_frequency_weighting(self, impl):
        # Three copies of one shingle outvote two others bit for bit.
        h = [ref.shingle_hash(s.encode()) for s in ("a a a", "a a b", "a b c")]
        text = "a a a a a a b c"  # shingles: aaa x4, aab, abc
        want = 0
        for b in range(64):
            vote = sum((4 if i == 0 else 1) * (1 if (x >> b) & 1 else -1) for i, x in enumerate(h))
            want |= (vote > 0) << b
        assert impl.simhash(text) == want

    def test_hamming(self, impl):
        assert impl.hamming(0, 0) == 0
        assert impl.hamming(0, 2**64 - 1) == 64
        assert impl.hamming(0b1011, 0b0001) == 2
        with pytest.raises(OverflowError):
            impl.hamming(-1, 0)
        with pytest.raises(OverflowError):
            impl.hamming(0, 2**64)

    def test_near_identical_texts_are_close(self, impl):
        rng = random.Random(5)
        vocab = [f"w{i}" for i in range(3000)]
        words = [rng.choice(vocab) for _ in range(1500)]
        base = " ".join(words)
        edited = words[:]
        for _ in range(10):  # change 10 of 1500 words
            edited[rng.randrange(len(edited))] = rng.choice(vocab)
        other = " ".join(rng.choice(vocab) for _ in range(1500))
        a, b, c = impl.simhash(base), impl.simhash(" ".join(edited)), impl.simhash(other)
        assert impl.hamming(a, b) <= 6
        assert impl.hamming(a, c) >= 16


@given(st.binary(max_size=64))
def test_shingle_hash_matches_reference(data):
    assert native.shingle_hash(data) == ref.shingle_hash(data)


@settings(max_examples=300, deadline=None)
@given(st.text(ALPHABET, max_size=300))
def test_native_matches_reference_on_tricky_text(text):
    assert native.simhash(text) == ref.simhash(text)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=400))
def test_native_matches_reference_on_any_text(text):
    assert native.simhash(text) == ref.simhash(text)


def test_native_matches_reference_on_long_text():
    # > 255 shingles exercises the lane flush; repeated shingles exercise weights.
    rng = random.Random(9)
    text = " ".join(rng.choice(["Alpha", "beta", "GAMMA", "δέλτα", "字字", "x1"]) for _ in range(5000))
    assert native.simhash(text) == ref.simhash(text)


def test_tokenizer_rule():
    assert ref.words("Don't stop_me, İstanbul Ⅻ 3.14") == ["don", "t", "stop", "me", "i", "stanbul", "ⅻ", "3", "14"]
    # The regex in the reference is exactly "maximal runs of str.isalnum() code points".
    text = "".join(map(chr, range(0x3000))) + "".join(chr(c) for c in range(0x10000, 0x10FFFF, 97))
    words, cur = [], []
    for ch in text.lower():
        if ch.isalnum():
            cur.append(ch)
        elif cur:
            words.append("".join(cur))
            cur = []
    if cur:
        words.append("".join(cur))
    assert ref.words(text) == words
    assert native.simhash(text) == ref.simhash(text)
