"""Task-shaped training prompts built from ShareGPT text, for the Spec-Bench shapes that ShareGPT
first turns and GSM8K questions leave out.

The drafters trained on the first corpus agreed with the target half as often on Spec-Bench as on
their own held-out prompts (accept@1 0.27 against 0.46 for EAGLE-3); the gap is in translation,
summarisation and retrieval-augmented QA, whose answers copy or rewrite a long context. These
prompts give the target such contexts to answer; the target's answers are the training text, so
what matters is the shape of the task, not the quality of a reference answer (there is none):

- `summarize`: "Summarize: " and a passage of assistant prose (the CNN/DM shape).
- `rag`: the assistant's answer to a human question and two other passages, in a seeded order,
  then the question on its own line (the shape of Spec-Bench's RAG prompts: retrieved passages,
  then the question).
- `translate`: "Translate German to English: " and one sentence of a non-English ShareGPT message
  (German, French, Spanish, Italian, Portuguese or Dutch, named in the prompt), spaced like the
  tokenised WMT text Spec-Bench uses.
- `qa`: a short self-contained human question from a later turn of a conversation (first turns are
  the `sharegpt` source already).

Every prompt is named by (source, index), and `text_of` rebuilds its text from the pinned ShareGPT
file alone, so a packed corpus records only that pair. Message ids are conversation * 1000 + turn;
a translation's index is its message id * 100 + its sentence number.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import random
import re
from collections.abc import Iterator

from train import sources

TASKS = ("summarize", "rag", "translate", "qa")

_TURNS = 1000  # message id = conversation * _TURNS + turn
_SENTENCES = 100  # translation index = message id * _SENTENCES + sentence

# Prose passages: long, mostly-ASCII assistant turns without code blocks, tables or long lists.
PROSE_CHARS = (800, 6000)
SUMMARY_CHARS = (1200, 2800)  # a summarised passage is cut at a sentence end in this range
RAG_PASSAGE_CHARS = (500, 1100)  # each retrieved passage
RAG_DISTRACTORS = 2
QUESTION_CHARS = (15, 200)
QA_CHARS = (15, 120)
SENTENCE_CHARS = (40, 300)

# Stopwords that mark a message's language (a message is that language when they are >= 15% of
# its words and no other language's are more frequent).
_LANGUAGES = {
  "German": "der die das und ist nicht ich mit sich auch auf für von den dem ein eine zu wir sie "
  "es im werden wird oder aber wenn",
  "French": "le la les et est une un des du pour pas que qui dans sur avec ce je vous il nous "
  "sont mais au",
  "Spanish": "el la los las y es una un del para que por en con no se su como más pero lo al",
  "Italian": "il la le gli e è una un del della per che non di con sono si come anche ma nel",
  "Portuguese": "o a os as e é uma um do da para que não de em com por se como mais mas no na",
  "Dutch": "de het een en is van dat die niet op te zijn met voor er maar ook als ik je wij",
}
_STOPWORDS = {lang: set(words.split()) for lang, words in _LANGUAGES.items()}
_LANGUAGES_OF = {
  w: [lang for lang, sw in _STOPWORDS.items() if w in sw] for w in set().union(*_STOPWORDS.values())
}
_ENGLISH = {"the", "and", "is", "of", "to", "in", "you", "that", "there", "are", "with", "have"}
_WORD = re.compile(r"[^\W\d_]+")
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]")
_LIST_LINE = re.compile(r"^\s*(\d+[.)]|[-*\u2022])", re.MULTILINE)  # numbered or bulleted lines
# A follow-up that leans on the conversation before it ("and the second one?").
_REFERENTIAL = re.compile(
  r"^(and|but|so|also|then|what about|how about|why not|it|that|this|these|those|they|he|she|"
  r"can you|could you|would you|will you|please|ok|okay|yes|no)\b",
  re.IGNORECASE,
)


def clip(text: str, lo: int, hi: int) -> str:
  """`text` cut to at most `hi` characters, at the last sentence end at or after `lo` if any."""
  if len(text) <= hi:
    return text
  cut = text[:hi]
  ends = [m.end() for m in re.finditer(r"[.!?](?=\s)", cut) if m.end() >= lo]
  return cut[: ends[-1]] if ends else cut


def language(text: str) -> str | None:
  """The language of `text` among `_LANGUAGES` by stopword share, or None (English, or unsure)."""
  words = [w.lower() for w in _WORD.findall(text)]
  if len(words) < 12:
    return None
  hits = dict.fromkeys(_STOPWORDS, 0)
  for w in words:  # one lookup per word, not one per word and language
    for lang in _LANGUAGES_OF.get(w, ()):
      hits[lang] += 1
  share = {lang: n / len(words) for lang, n in hits.items()}
  best = max(share, key=share.get)
  return best if share[best] >= 0.15 and _english_share(words) < 0.05 else None


def _english_share(words: list[str]) -> float:
  return sum(w in _ENGLISH for w in words) / max(len(words), 1)


def wmt_spacing(sentence: str) -> str:
  """Punctuation spaced off as in tokenised WMT text ("Singapur , da ...")."""
  return re.sub(r"\s*([,.;:!?])", r" \1", sentence).strip()


@dataclasses.dataclass(frozen=True)
class Pools:
  """Everything the task prompts are drawn from, by message id (deterministic given the file).

  Attributes:
    messages: {message id: text} of every string turn.
    prose: sorted message ids of assistant prose passages.
    rag_questions: sorted message ids of human questions answered by a prose turn right after.
    qa: sorted message ids of short self-contained human questions after the first turn.
    sentences: sorted translation indices (message id * 100 + sentence number) of sentences in
      a non-English language, with the language.
  """

  messages: dict[int, str]
  prose: tuple[int, ...]
  rag_questions: tuple[int, ...]
  qa: tuple[int, ...]
  sentences: dict[int, tuple[str, str]]


def _is_prose(turn: dict, text: str) -> bool:
  lo, hi = PROSE_CHARS
  return (
    turn.get("from") == "gpt"
    and lo <= len(text) <= hi
    and "```" not in text
    and "|" not in text
    and text.count(". ") >= 5
    and len(_LIST_LINE.findall(text)) <= 3
    and sources.ascii_fraction(text) >= 0.98
  )


def _is_question(text: str, chars: tuple[int, int]) -> bool:
  return (
    chars[0] <= len(text) <= chars[1]
    and text.endswith("?")
    and "\n" not in text
    and sources.ascii_fraction(text) >= 0.99
  )


def build_pools(data: bytes) -> Pools:
  """The pools of the ShareGPT file `data` (`sources.SHAREGPT`'s verified bytes)."""
  messages: dict[int, str] = {}
  prose, rag, qa, sentences = [], [], [], {}
  for c, turns in enumerate(sources.sharegpt_conversations(data)):
    texts = [t.get("value") if isinstance(t.get("value"), str) else None for t in turns]
    first_human = next((j for j, t in enumerate(turns) if t.get("from") == "human"), None)
    for j, (turn, text) in enumerate(zip(turns, texts)):
      if text is None or j >= _TURNS:
        continue
      text = text.strip()
      mid = c * _TURNS + j
      messages[mid] = text
      if _is_prose(turn, text):
        prose.append(mid)
      if turn.get("from") != "human":
        continue
      nxt = turns[j + 1] if j + 1 < len(turns) else None
      if (
        _is_question(text, QUESTION_CHARS)
        and nxt is not None
        and isinstance(texts[j + 1], str)
        and _is_prose(nxt, texts[j + 1].strip())
      ):
        rag.append(mid)
      if j != first_human and _is_question(text, QA_CHARS) and not _REFERENTIAL.match(text):
        qa.append(mid)
      lang = language(text) if len(text) >= 80 else None
      if lang:
        for s, m in enumerate(_SENTENCE.finditer(text)):
          sent = " ".join(m.group(0).split())
          english = _english_share([w.lower() for w in _WORD.findall(sent)]) >= 0.1
          if s < _SENTENCES and SENTENCE_CHARS[0] <= len(sent) <= SENTENCE_CHARS[1] and not english:
            sentences[mid * _SENTENCES + s] = (lang, sent)
  return Pools(messages, tuple(prose), tuple(rag), tuple(qa), sentences)


@functools.lru_cache(maxsize=1)
def pools() -> Pools:
  """The pools of the pinned ShareGPT file (built once per process, a few seconds)."""
  return build_pools(sources.read_bytes(sources.SHAREGPT))


def _rag_text(p: Pools, mid: int) -> str:
  lo, hi = RAG_PASSAGE_CHARS
  rng = random.Random(mid)
  picks = rng.sample(p.prose, min(RAG_DISTRACTORS + 1, len(p.prose)))
  others = [m for m in picks if m != mid + 1]
  passages = [p.messages[m] for m in [mid + 1] + others[:RAG_DISTRACTORS]]
  rng.shuffle(passages)
  return "\n".join(clip(t, lo, hi) for t in passages) + "\n" + p.messages[mid]


def text_of(source: str, index: int, p: Pools | None = None) -> str:
  """The prompt text of task `source` at `index` (rebuilt from the ShareGPT file alone).

  Raises:
    KeyError: `index` names no prompt of that task.
  """
  p = p or pools()
  if source == "translate":
    lang, sent = p.sentences[index]
    return f"Translate {lang} to English: {wmt_spacing(sent)}"
  ids = {"summarize": p.prose, "rag": p.rag_questions, "qa": p.qa}.get(source)
  if ids is None:
    raise KeyError(f"unknown task source {source!r}; tasks are {TASKS}")
  at = bisect.bisect_left(ids, index)
  if at == len(ids) or ids[at] != index:
    raise KeyError(f"message {index} is not in the {source} pool of this ShareGPT file")
  if source == "summarize":
    return "Summarize: " + clip(p.messages[index], *SUMMARY_CHARS)
  if source == "rag":
    return _rag_text(p, index)
  return p.messages[index]


def candidates(source: str, p: Pools | None = None) -> Iterator[tuple[int, str]]:
  """(index, text) of every prompt of task `source`, in index order."""
  p = p or pools()
  ids = {
    "summarize": p.prose,
    "rag": p.rag_questions,
    "translate": tuple(sorted(p.sentences)),
    "qa": p.qa,
  }[source]
  for i in ids:
    yield i, text_of(source, i, p)
