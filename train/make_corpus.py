"""Builds (or resumes) the self-distilled corpus, or packs it into one committed file.

    python train/make_corpus.py --out=$HOME/.cache/specjax/corpus/smollm2-sd-v1 --max_tokens=1200000
    python train/make_corpus.py --out=... --pack=train/corpora/smollm2-sd-v1.npz

An extended corpus keeps a packed one's documents and adds task-shaped prompts
(`train/task_prompts.py`; the committed smollm2-sd-v2 was made this way):

    python train/make_corpus.py --out=$HOME/.cache/specjax/corpus/smollm2-sd-v2 \
        --extend=train/corpora/smollm2-sd-v1.npz --max_tokens=3000000
    python train/make_corpus.py --out=... --extend=... --pack=train/corpora/smollm2-sd-v2.npz

Rerun the same command after an interruption: finished documents are kept, in-flight ones redone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from specjax import integrity  # noqa: E402
from specjax.loading import registry  # noqa: E402
from train import corpus, decontam, prompts, sources  # noqa: E402

_OUT = flags.DEFINE_string("out", "", "Corpus directory (shards, manifest, prompt list).")
_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Registry name of the target.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Target dtype while decoding.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1_200_000, "Stop at this many response tokens.")
_BATCH = flags.DEFINE_integer("batch", 64, "Decode slots B.")
_REFILL = flags.DEFINE_integer("refill", 8, "Slots refilled together G.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512, "Response budget per prompt.")
_HELDOUT = flags.DEFINE_integer("n_heldout", 200, "Prompts (list front) held out for evaluation.")
_PACK = flags.DEFINE_string("pack", "", "Write the stored documents to this .npz and stop.")
_RESUME_FROM = flags.DEFINE_string(
  "resume_from", "", "A packed corpus (.npz) to start an empty --out from, then continue it."
)
_EXTEND = flags.DEFINE_string(
  "extend", "", "A packed corpus to extend with task-shaped prompts (its documents are kept)."
)
_TASKS = flags.DEFINE_string(
  "tasks",
  "summarize:1200,rag:1300,translate:700,qa:1500",
  "With --extend: task:prompts wanted, comma-separated (train/task_prompts.py TASKS).",
)
_HELDOUT_PER_TASK = flags.DEFINE_integer(
  "heldout_per_task", 40, "With --extend: held out per task."
)
_BASE_MORE = flags.DEFINE_integer(
  "n_base_more", 3000, "With --extend: unanswered base prompts shuffled in with the tasks."
)


def task_recipe(base_path: str) -> prompts.TaskRecipe:
  """The extension recipe of --extend, --tasks, --heldout_per_task and --n_base_more."""
  meta = corpus.read_meta(base_path)
  tasks = tuple((t, int(n)) for t, n in (item.split(":") for item in _TASKS.value.split(",")))
  return prompts.TaskRecipe(
    base=os.path.basename(base_path),
    base_sha256=meta["sha256"],
    tasks=tasks,
    heldout_per_task=_HELDOUT_PER_TASK.value,
    n_base_more=_BASE_MORE.value,
    min_ascii=meta["manifest"]["recipe"]["min_ascii"],
  )


def extended_list(
  out_dir: str, recipe: prompts.TaskRecipe, tokenizer, base_path: str
) -> tuple[list[prompts.TrainPrompt], int]:
  """The extended prompt list and its held-out count, built once and kept in out_dir/prompts.json."""
  recipe_dict = json.loads(json.dumps(dataclasses.asdict(recipe)))
  saved = _saved_list(out_dir, recipe_dict)
  if saved:
    return saved
  meta = corpus.read_meta(base_path)
  base = corpus.prompts_from_order(meta["prompt_order"], tokenizer, recipe.min_ascii)
  answered = {d.prompt_index for d in corpus.load_documents(base_path)}
  clean = decontam.Decontaminator(sources.eval_texts())
  plist, n_heldout = prompts.extend_prompts(
    recipe, base, meta["manifest"]["recipe"]["n_heldout"], answered, tokenizer, clean
  )
  _save_list(out_dir, recipe_dict, plist, n_heldout)
  return plist, n_heldout


def _saved_list(out_dir: str, recipe: dict) -> tuple[list[prompts.TrainPrompt], int] | None:
  """The prompt list kept in out_dir/prompts.json (checked against `recipe`), or None."""
  path = os.path.join(out_dir, "prompts.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    saved = json.load(f)
  if saved["recipe"] != recipe:
    raise ValueError(f"{path} was built from recipe {saved['recipe']}, not {recipe}")
  plist = [prompts.TrainPrompt(p[0], p[1], p[2], tuple(p[3])) for p in saved["prompts"]]
  return plist, saved.get("n_heldout", recipe.get("n_heldout"))


def _save_list(out_dir: str, recipe: dict, plist, n_heldout: int) -> None:
  os.makedirs(out_dir, exist_ok=True)
  rows = [[p.source, p.index, p.text, list(p.tokens)] for p in plist]
  fp = prompts.fingerprint(plist)
  integrity.write_json_atomic(
    os.path.join(out_dir, "prompts.json"),
    {"recipe": recipe, "fingerprint": fp, "n_heldout": n_heldout, "prompts": rows},
  )


def prompt_list(
  out_dir: str, recipe: dict, tokenizer, packed: str = ""
) -> tuple[list[prompts.TrainPrompt], int]:
  """The recipe's prompts and held-out count, built once and kept in out_dir/prompts.json (checked
  on reuse).

  With `packed` (a packed corpus), the list is rebuilt from the order that file records, so a
  corpus continues with exactly its own prompt list even if the filters changed since.
  """
  saved = _saved_list(out_dir, recipe)
  if saved:
    return saved
  if packed:
    meta = corpus.read_meta(packed)
    plist = corpus.prompts_from_order(meta["prompt_order"], tokenizer, recipe["min_ascii"])
    if prompts.fingerprint(plist) != meta["manifest"]["prompts_fingerprint"]:
      raise ValueError(f"the prompts rebuilt from {packed} do not match its fingerprint")
    n_heldout = meta.get("n_heldout", recipe.get("n_heldout"))
  else:
    plist = prompts.build_prompts(prompts.PromptRecipe(**recipe), tokenizer)
    n_heldout = recipe["n_heldout"]
  _save_list(out_dir, recipe, plist, n_heldout)
  return plist, n_heldout


def main(argv):
  del argv
  if not _OUT.value:
    raise app.UsageError("--out is required")
  out = os.path.expanduser(_OUT.value)
  params, cfg, tok = registry.load_model(_TARGET.value, dtype=_DTYPE.value)
  if _RESUME_FROM.value:  # continue a packed corpus with its own recipe and prompt list
    recipe = corpus.read_meta(_RESUME_FROM.value)["manifest"]["recipe"]
    plist, n_heldout = prompt_list(out, recipe, tok, _RESUME_FROM.value)
  elif _EXTEND.value:
    extension = task_recipe(_EXTEND.value)
    recipe = json.loads(json.dumps(dataclasses.asdict(extension)))  # as the manifest stores it
    plist, n_heldout = extended_list(out, extension, tok, _EXTEND.value)
  else:
    recipe = dataclasses.asdict(prompts.PromptRecipe(n_heldout=_HELDOUT.value, **corpus.RECIPE))
    plist, n_heldout = prompt_list(out, recipe, tok)
  counts = {s: sum(p.source == s for p in plist) for s in dict.fromkeys(p.source for p in plist)}
  print(f"corpus: {len(plist)} prompts {counts}, {n_heldout} held out")
  if _PACK.value:
    meta = corpus.pack_corpus(out, _PACK.value, plist, n_heldout)
    print({k: meta[k] for k in ("documents", "response_tokens", "heldout_documents", "sha256")})
    return
  engine = corpus.EngineSettings(
    batch=_BATCH.value, refill=_REFILL.value, max_new_tokens=_MAX_NEW.value
  )
  model = registry.MODELS.get(_TARGET.value)
  manifest = dict(
    version=corpus.CORPUS_VERSION,
    target=_TARGET.value,
    target_source_sha256=model.sha256 if model else "",
    target_weights=integrity.weights_fingerprint(params),
    dtype=_DTYPE.value,
    decoding="greedy",
    max_new_tokens=engine.max_new_tokens,
    recipe=recipe,
    prompts_fingerprint=prompts.fingerprint(plist),
  )
  if _RESUME_FROM.value:
    n = corpus.seed_from_packed(out, _RESUME_FROM.value, manifest)
    print(f"corpus: {n} documents imported from {_RESUME_FROM.value}" if n else "corpus: resuming")
  elif _EXTEND.value:
    n = corpus.seed_from_base(out, _EXTEND.value, plist, manifest)
    print(f"corpus: {n} documents taken from {_EXTEND.value}" if n else "corpus: resuming")
  stats = corpus.build_corpus(
    params, cfg, plist, tok.stop_ids, engine, out, manifest, _MAX_TOKENS.value
  )
  rate = stats["generated"] / max(stats["seconds"], 1e-9)
  print(
    f"corpus: this run {stats['documents']} documents, {stats['generated']} tokens, {rate:.0f}/s"
  )


if __name__ == "__main__":
  app.run(main)
