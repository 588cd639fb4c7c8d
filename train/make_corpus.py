"""Builds (or resumes) the self-distilled corpus, or packs it into one committed file.

    python train/make_corpus.py --out=$HOME/.cache/specjax/corpus/smollm2-sd-v1 --max_tokens=1200000
    python train/make_corpus.py --out=... --pack=train/corpora/smollm2-sd-v1.npz

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
from train import corpus, prompts  # noqa: E402

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


def prompt_list(
  out_dir: str, recipe: prompts.PromptRecipe, tokenizer, packed: str = ""
) -> list[prompts.TrainPrompt]:
  """The recipe's prompts, built once and kept in out_dir/prompts.json (checked on reuse).

  With `packed` (a packed corpus), a new list is rebuilt from the order that file records, so a
  corpus continues with exactly its own prompt list even if the filters changed since.
  """
  path = os.path.join(out_dir, "prompts.json")
  want = dataclasses.asdict(recipe)
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    if saved["recipe"] != want:
      raise ValueError(f"{path} was built from recipe {saved['recipe']}, not {want}")
    return [prompts.TrainPrompt(p[0], p[1], p[2], tuple(p[3])) for p in saved["prompts"]]
  if packed:
    with open(packed[: -len(".npz")] + ".json") as f:
      meta = json.load(f)
    plist = corpus.prompts_from_order(meta["prompt_order"], tokenizer, recipe.min_ascii)
    if prompts.fingerprint(plist) != meta["manifest"]["prompts_fingerprint"]:
      raise ValueError(f"the prompts rebuilt from {packed} do not match its fingerprint")
  else:
    plist = prompts.build_prompts(recipe, tokenizer)
  os.makedirs(out_dir, exist_ok=True)
  with open(path + ".part", "w") as f:
    rows = [[p.source, p.index, p.text, list(p.tokens)] for p in plist]
    json.dump({"recipe": want, "fingerprint": prompts.fingerprint(plist), "prompts": rows}, f)
  os.replace(path + ".part", path)
  return plist


def main(argv):
  del argv
  if not _OUT.value:
    raise app.UsageError("--out is required")
  out = os.path.expanduser(_OUT.value)
  params, cfg, tok = registry.load_model(_TARGET.value, dtype=_DTYPE.value)
  recipe = prompts.PromptRecipe(n_heldout=_HELDOUT.value, **corpus.RECIPE)
  plist = prompt_list(out, recipe, tok, _RESUME_FROM.value)
  print(f"corpus: {len(plist)} prompts ({sum(p.source == 'gsm8k_train' for p in plist)} GSM8K)")
  if _PACK.value:
    meta = corpus.pack_corpus(out, _PACK.value, plist, recipe.n_heldout)
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
    recipe=dataclasses.asdict(recipe),
    prompts_fingerprint=prompts.fingerprint(plist),
  )
  if _RESUME_FROM.value:
    n = corpus.seed_from_packed(out, _RESUME_FROM.value, manifest)
    print(f"corpus: {n} documents imported from {_RESUME_FROM.value}" if n else "corpus: resuming")
  stats = corpus.build_corpus(
    params, cfg, plist, tok.stop_ids, engine, out, manifest, _MAX_TOKENS.value
  )
  rate = stats["generated"] / max(stats["seconds"], 1e-9)
  print(
    f"corpus: this run {stats['documents']} documents, {stats['generated']} tokens, {rate:.0f}/s"
  )


if __name__ == "__main__":
  app.run(main)
