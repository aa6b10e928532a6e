"""Deterministic text for simweb pages: a fixed vocabulary and a seeded paragraph pool.

Pages are assembled from pre-built paragraphs so that rendering a 5-30 KB page is a join of
byte strings, not thousands of random draws: the server has to stay cheap on a shared core.
Words follow a Zipf-like frequency so that simhash and shingling see text-like statistics.
"""

from __future__ import annotations

import random
from itertools import accumulate

_ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "ie", "oo")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "rk", "ng")

VOCABULARY_SIZE = 3000
PARAGRAPH_POOL_SIZE = 1024


def _make_vocabulary() -> tuple[str, ...]:
    """The same word list in every process and for every seed (the vocabulary is fixed)."""
    rng = random.Random("simweb-vocabulary-v1")
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < VOCABULARY_SIZE:
        syllables = rng.choice((1, 1, 2, 2, 2, 3, 3, 4))
        word = "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
                       for _ in range(syllables))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return tuple(words)


VOCABULARY: tuple[str, ...] = _make_vocabulary()
# Zipf weights (s = 1): rank r has weight 1/r, like word frequencies in natural text.
_CUM_WEIGHTS = tuple(accumulate(1.0 / r for r in range(1, VOCABULARY_SIZE + 1)))


def words(rng: random.Random, n: int) -> list[str]:
    """n words drawn from the vocabulary with Zipf frequencies."""
    return rng.choices(VOCABULARY, cum_weights=_CUM_WEIGHTS, k=n)


def sentence(rng: random.Random, n_words: int) -> str:
    w = words(rng, n_words)
    w[0] = w[0].capitalize()
    return " ".join(w) + "."


class ParagraphPool:
    """Pre-built HTML paragraphs.

    Key: paragraph index 0..size-1. Value: ``<p>…</p>\\n`` as UTF-8 bytes (ASCII letters only, so
    nothing needs escaping); ``anchors`` likewise holds link texts. Invariant: both are a pure
    function of the seed.
    """

    __slots__ = ("paragraphs", "anchors")

    ANCHOR_BITS = 12   # 4096 anchor texts, picked with getrandbits (cheaper than choices per link)

    def __init__(self, seed: int, size: int = PARAGRAPH_POOL_SIZE) -> None:
        rng = random.Random(f"simweb-paragraphs/{seed}")
        paragraphs = []
        for _ in range(size):
            n_sentences = rng.randint(3, 12)
            text = " ".join(sentence(rng, rng.randint(6, 22)) for _ in range(n_sentences))
            paragraphs.append(f"<p>{text}</p>\n".encode())
        self.paragraphs: tuple[bytes, ...] = tuple(paragraphs)
        self.anchors: tuple[str, ...] = tuple(" ".join(words(rng, rng.randint(1, 4)))
                                              for _ in range(1 << self.ANCHOR_BITS))

    def __len__(self) -> int:
        return len(self.paragraphs)

    def pick(self, rng: random.Random, target_bytes: int) -> list[int]:
        """Paragraph indices whose total size first reaches target_bytes."""
        chosen: list[int] = []
        total = 0
        n = len(self.paragraphs)
        while total < target_bytes:
            idx = int(rng.random() * n)   # cheaper than randrange; deterministic all the same
            chosen.append(idx)
            total += len(self.paragraphs[idx])
        return chosen
