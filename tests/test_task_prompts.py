"""Task-shaped training prompts: built from ShareGPT-format text, rebuilt from (source, index), and
ordered so that an extended corpus keeps its base's documents and held-out split."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.toy_models import tiny_model
from train import corpus, decontam, task_prompts
from train.prompts import TaskRecipe, TrainPrompt, extend_prompts

PROSE = (
  "The river town grew slowly over two centuries. Its first settlers were fishermen. They built "
  "houses on stilts above the flood line. Later a railway reached the valley. Merchants arrived "
  "with it and opened shops along the main street. The old harbour fell quiet. Today the town "
  "is known for its autumn market. Visitors come from far away to buy apples and cider. "
)


def _sharegpt(conversations: list[list[tuple[str, str]]]) -> bytes:
  """A ShareGPT-format file (truncated after the last element, as the real one is)."""
  items = [
    {"id": str(i), "conversations": [{"from": f, "value": v} for f, v in turns]}
    for i, turns in enumerate(conversations)
  ]
  return (json.dumps(items)[:-1] + ', {"id": "cut", "conv').encode()


@pytest.fixture(scope="module")
def pools():
  german = (
    "Die Stadt ist alt. Wir haben dort ein Haus mit einem Garten gekauft. "
    "Es ist nicht weit von der Schule und die Kinder gehen zu Fuss."
  )
  convs = [
    [("human", "Tell me about the river town."), ("gpt", PROSE * 3)],
    [("human", "Why did the old harbour fall quiet?"), ("gpt", PROSE * 3 + "The end.")],
    [("human", "hi"), ("gpt", "Hello!"), ("human", "How tall is the tallest tree on Earth?")],
    [("human", german), ("gpt", "This is German text about a town.")],
    [("human", "x"), ("gpt", "y"), ("human", "and what about the second one?")],
    [("human", "write code"), ("gpt", "```python\nprint(1)\n```" + PROSE * 2)],
  ]
  return task_prompts.build_pools(_sharegpt(convs))


def test_pools_pick_each_task_shape(pools):
  assert pools.prose == (1, 1001)  # message ids: conversation * 1000 + turn; code is no prose
  assert pools.rag_questions == (1000,)  # a question whose answer right after it is prose
  assert pools.qa == (2002,)  # a later-turn question; a referential follow-up is not one
  langs = {lang for lang, _ in pools.sentences.values()}
  assert langs == {"German"} and len(pools.sentences) == 2  # the first sentence is too short


def test_task_texts_rebuild_from_source_and_index(pools):
  summary = task_prompts.text_of("summarize", 1, pools)
  assert summary.startswith("Summarize: The river town") and summary.endswith(".")
  assert len(summary) <= len("Summarize: ") + task_prompts.SUMMARY_CHARS[1]
  rag = task_prompts.text_of("rag", 1000, pools)
  assert rag.endswith("\nWhy did the old harbour fall quiet?") and "The river town" in rag
  sentence = min(pools.sentences)
  assert task_prompts.text_of("translate", sentence, pools) == (
    "Translate German to English: Wir haben dort ein Haus mit einem Garten gekauft ."
  )
  assert task_prompts.text_of("qa", 2002, pools) == "How tall is the tallest tree on Earth?"
  for task in task_prompts.TASKS:  # the same text every time: a corpus records only the index
    for index, text in task_prompts.candidates(task, pools):
      assert task_prompts.text_of(task, index, pools) == text
  with pytest.raises(KeyError):
    task_prompts.text_of("summarize", 3000, pools)


def test_clip_cuts_at_a_sentence_end():
  text = "One two. Three four five. Six seven eight nine ten."
  assert task_prompts.clip(text, 5, 30) == "One two. Three four five."
  assert task_prompts.clip(text, 5, 100) == text
  assert task_prompts.clip("no sentence end here at all", 3, 10) == "no sentenc"


class _Words:
  """A tokenizer stand-in: one token per word."""

  def encode_chat(self, messages):
    return [len(w) for w in messages[-1]["content"].split()]


def test_extended_list_keeps_the_base_split_and_drops_contaminated_prompts(pools):
  base = [TrainPrompt("sharegpt", i, f"base prompt number {i} " * 3, (i,)) for i in range(10)]
  base[6] = TrainPrompt("sharegpt", 6, "how tall is the tallest tree on earth", (6,))
  clean = decontam.Decontaminator({"eval": ["How tall is the tallest tree on Earth?"]})
  recipe = TaskRecipe(
    "base.npz", "0" * 64, (("summarize", 2), ("qa", 1)), heldout_per_task=1, n_base_more=2,
    min_tokens=1,
  )  # fmt: skip
  plist, n_heldout = extend_prompts(recipe, base, 2, {2, 3, 4}, _Words(), clean, pools)
  names = [(p.source, p.index) for p in plist]
  # Front: the base's held-out 0 and 1, then one held-out prompt per task with any (qa's only
  # candidate is an evaluation question: dropped).
  assert names[:3] == [("sharegpt", 0), ("sharegpt", 1), ("summarize", names[2][1])]
  assert n_heldout == 3
  assert names[3:6] == [("sharegpt", 2), ("sharegpt", 3), ("sharegpt", 4)]  # answered, in order
  # Then the other summary shuffled with the next two unanswered base prompts, then the rest;
  # the contaminated base prompt 6 is gone.
  assert sorted(names[6:9]) == sorted(
    [("summarize", 1001 if names[2][1] == 1 else 1), ("sharegpt", 5), ("sharegpt", 7)]
  )
  assert names[9:] == [("sharegpt", 8), ("sharegpt", 9)]
  assert ("sharegpt", 6) not in names


def test_an_extended_corpus_takes_its_base_documents(tmp_path):
  params, cfg = tiny_model(3, scale=0.3)
  engine = corpus.EngineSettings(
    batch=2, refill=2, chunk_steps=4, max_new_tokens=6, prompt_bucket=8
  )
  base = [TrainPrompt("sharegpt", i, f"p{i}", (5 + i, 6, 7)) for i in range(4)]
  manifest = {"target": "toy", "max_new_tokens": 6, "recipe": "base"}
  corpus.build_corpus(params, cfg, base, (3,), engine, str(tmp_path / "b"), manifest, 10_000)
  corpus.pack_corpus(str(tmp_path / "b"), str(tmp_path / "b.npz"), base, n_heldout=1)
  # The extension reorders the base and adds a task; base prompt 2 changed its tokens (not taken).
  ext = [base[3], TrainPrompt("qa", 9, "q", (9, 9)), base[0], base[1]]
  ext += [TrainPrompt("sharegpt", 2, "p2", (1, 1))]
  want = dict(manifest, recipe="extended")
  assert corpus.seed_from_base(str(tmp_path / "e"), str(tmp_path / "b.npz"), ext, want) == 3
  docs = {d.prompt_index: d for d in corpus.load_documents(str(tmp_path / "b.npz"))}
  taken = corpus.done_prompts(str(tmp_path / "e"))
  assert taken == {0, 2, 3}
  with np.load(next((tmp_path / "e").glob("shard_*.npz"))) as z:
    starts = np.concatenate([[0], np.cumsum(z["doc_lens"])[:-1]])
    got = {
      int(i): z["tokens"][s : s + n].tolist()
      for i, s, n in zip(z["prompt_index"], starts, z["doc_lens"])
    }
  assert got[0] == list(docs[3].tokens) and got[2] == list(docs[0].tokens)
  # A base generated by another target (or budget) lends nothing.
  with pytest.raises(ValueError, match="max_new_tokens: 6 there, 7 now"):
    corpus.seed_from_base(
      str(tmp_path / "f"), str(tmp_path / "b.npz"), ext, dict(want, max_new_tokens=7)
    )
