"""Keeping evaluation prompts out of training text: exact and near-duplicate matching on word n-grams.

Texts are normalised (Unicode NFKC, lower case, every run of non-alphanumerics a single space) and
cut into word n-grams. A training text is contaminated by an evaluation text e when it contains e
whole, or shares at least `min(ceil(frac * grams(e)), max_hits)` of e's distinct n-grams: half of a
short prompt reworded at the edges, or a 20-word passage of a long article, is enough. It is also
contaminated when it shares a long run of characters with e (normalised text, `span` characters
sampled every `span // 3` along e, so any shared run of `4 * span // 3` characters is caught): a
phrase of a dozen common words can sit below the n-gram threshold (the first corpus let one through).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence

_NON_WORD = re.compile(r"[^0-9a-z]+")


def normalize(text: str) -> tuple[str, ...]:
  """The words of `text` after NFKC, lower-casing and punctuation removal."""
  text = unicodedata.normalize("NFKC", text).lower()
  return tuple(w for w in _NON_WORD.split(text) if w)


def ngrams(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
  """Distinct word n-grams; a text shorter than n words is its own single gram."""
  if len(words) <= n:
    return {tuple(words)} if words else set()
  return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@dataclasses.dataclass(frozen=True)
class Match:
  """Why a training text was rejected: which evaluation text it overlaps and by how much."""

  eval_set: str
  eval_index: int
  shared: int
  needed: int


class Decontaminator:
  """An n-gram index over evaluation texts that flags overlapping training texts.

  Args:
    eval_sets: {set name: texts}.
    n: n-gram length in words.
    frac: fraction of an evaluation text's n-grams that marks a near duplicate.
    max_hits: shared n-grams that always mark a match (long passages quoted in part).
    span: characters of normalised text whose shared run marks a match.
  """

  def __init__(
    self,
    eval_sets: Mapping[str, Sequence[str]],
    n: int = 8,
    frac: float = 0.5,
    max_hits: int = 13,
    span: int = 48,
  ):
    self.n, self.span = n, span
    self._spans: dict[str, int] = {}
    self._index: dict[tuple[str, ...], list[int]] = collections.defaultdict(list)
    self._ids: list[tuple[str, int]] = []
    self._needed: list[int] = []
    self._short_lengths: set[int] = set()
    for name, texts in eval_sets.items():
      for i, text in enumerate(texts):
        words = normalize(text)
        grams = ngrams(words, n)
        if not grams:
          continue
        if len(words) < n:
          self._short_lengths.add(len(words))
        eid = len(self._ids)
        self._ids.append((name, i))
        flat = " ".join(words)
        for j in range(0, len(flat) - span + 1, max(span // 3, 1)):
          self._spans.setdefault(flat[j : j + span], eid)
        self._needed.append(min(math.ceil(frac * len(grams)), max_hits))
        for g in grams:
          self._index[g].append(eid)

  def __len__(self) -> int:
    return len(self._ids)

  def match(self, text: str) -> Match | None:
    """The strongest evaluation text `text` overlaps, or None if it is clean."""
    words = normalize(text)
    grams = ngrams(words, self.n)
    for m in self._short_lengths:
      grams |= {tuple(words[i : i + m]) for i in range(len(words) - m + 1)}
    hits: collections.Counter[int] = collections.Counter()
    for g in grams:
      for eid in self._index.get(g, ()):
        hits[eid] += 1
    best = None
    for eid, count in hits.items():
      if count >= self._needed[eid] and (best is None or count > best.shared):
        best = Match(*self._ids[eid], count, self._needed[eid])
    return best or self._span_match(" ".join(words))

  def _span_match(self, flat: str) -> Match | None:
    """A run of `span` characters shared with an evaluation text (shared = needed = 1)."""
    for j in range(len(flat) - self.span + 1):
      eid = self._spans.get(flat[j : j + self.span])
      if eid is not None:
        return Match(*self._ids[eid], 1, 1)
    return None

  def is_clean(self, text: str) -> bool:
    return self.match(text) is None

  def filter(self, texts: Iterable[str]) -> tuple[list[int], list[Match]]:
    """Indices of clean texts, and the matches of the rejected ones."""
    keep, rejected = [], []
    for i, text in enumerate(texts):
      m = self.match(text)
      if m is None:
        keep.append(i)
      else:
        rejected.append(m)
    return keep, rejected
