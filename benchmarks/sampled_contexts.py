"""Would a corpus sampled at T = 1 help drafting at T > 0? A measurement before building one.

Every drafter is distilled on the target's full next-token distribution at each position, so a
sampled corpus changes only the contexts it learns from: greedy responses now, T = 1 samples
then. Decoding at T = 1 drafts after sampled text, so what such a corpus could recover is at most
what a head trained on greedy text loses on sampled text. This script measures that loss for a
shipped EAGLE head. For the same held-out prompts of the committed corpus (never trained on) it
reads through the target (a) the target's greedy response from the corpus and (b) a response
sampled from the target at `--temperature`, both cut to `--max_new_tokens`, and scores the head on
each:
  * alpha_j: the probability that the lossless rule at that temperature accepts the head's token
    at draft step j, sum_x min(p(x), q(x)) (p the target's full softmax, q the head's, both at
    the temperature), the head unrolled on the document's tokens as in training's held-out
    evaluation; `tau_sampled` is the K = 4 chain's expected tokens per pass from them;
  * top1_step j: whether the head's top token is the target's (what greedy decoding accepts);
    `tau_greedy` likewise;
  * target_entropy: the target's own entropy there (nats, at the temperature). Where it is higher,
    no drafter can match the target as well, so part of a fall in alpha is intrinsic;
over every response position and over each response's first 64 tokens.

  python benchmarks/sampled_contexts.py --docs=128 --max_new_tokens=128
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax.drafters.eagle import head_logits
from specjax.drafters.shipped import load_shipped
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.loading.registry import load_model
from specjax.sampling import SamplingConfig
from train import corpus, teacher_forced
from train.data import Windows
from train.features import FeatureStore
from train.loop import simulated_tau
from train.losses import ahead, same_doc
from train.objectives.common import output_matrix
from train.pipeline import make_objective
from train.settings import SMOLLM2, SMOLLM2_CORPUS

_HEAD = flags.DEFINE_string("head", "eagle3-smollm2-135m", "shipped EAGLE head to score")
_DOCS = flags.DEFINE_integer("docs", 128, "held-out prompts of the corpus")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "response tokens kept (and sampled)")
_BATCH = flags.DEFINE_integer("batch", 16, "rows per sampling call")
_TEMP = flags.DEFINE_float("temperature", 1.0, "sampling temperature of (b) and of alpha_1")
_SEED = flags.DEFINE_integer("seed", 0, "sampling seed")
_FIRST = flags.DEFINE_integer("first", 64, "also score each response's first N tokens alone")


def greedy_documents(docs, max_new: int) -> list[teacher_forced.Document]:
  return [
    dataclasses.replace(d, tokens=d.tokens[: d.prompt_len + max_new], heldout=True) for d in docs
  ]


def sampled_documents(params, cfg, docs, max_new, batch, temperature, seed, stop_ids):
  """The same prompts answered by the target sampling at `temperature` (seeded)."""
  gen = GenerateConfig(
    max_new_tokens=max_new, sampling=SamplingConfig(temperature=temperature), stop_tokens=stop_ids
  )
  key, out = jax.random.PRNGKey(seed), []
  for lo in range(0, len(docs), batch):
    chunk = docs[lo : lo + batch]
    tokens, lens = pad_prompts([list(d.tokens[: d.prompt_len]) for d in chunk], bucket=128)
    key, sub = jax.random.split(key)
    o = generate(params, cfg, tokens, lens, gen, key=sub)
    for d, row, n in zip(chunk, np.asarray(o.tokens), np.asarray(o.lengths)):
      response = tuple(int(t) for t in row[:n])
      out.append(dataclasses.replace(d, tokens=d.tokens[: d.prompt_len] + response, heldout=True))
  return out


def agreement_fn(objective, temperature: float):
  """jit(trainable, frozen, full_head, batch, responses) -> {part: {metric: (sum, count)}}, one
  part per response mask in `responses` (the same windows scored on other positions), per draft
  step j: alpha_j, the probability that the rule at `temperature` accepts step j's drafted token;
  top1_j, whether the head's top token is the target's; and the target's entropy at step 1's
  positions."""

  def fn(trainable, frozen, full_head, batch, responses):
    p = objective.params(trainable, frozen)
    out = {part: {} for part in responses}
    for j, o in enumerate(objective.unroll(trainable, frozen, batch), 1):
      logits = head_logits(p, o, objective.cfg.norm_eps)
      q = jax.nn.softmax(logits / temperature, -1)
      # Step j at t drafts x_{t+j+1}, which the target scores from its state after x_{t+j}.
      target = jnp.einsum("btd,vd->btv", ahead(batch.hidden, j).astype(jnp.float32), full_head)
      logp = jax.nn.log_softmax(target / temperature, -1)
      alpha = jnp.minimum(jnp.exp(logp)[..., frozen["d2t"]], q).sum(-1)
      top1 = frozen["d2t"][jnp.argmax(logits, -1)] == jnp.argmax(target, -1)
      entropy = -jnp.sum(jnp.exp(logp) * logp, -1)  # how predictable the target itself is
      for part, response in responses.items():
        mask = (same_doc(batch, j + 1) & ahead(response, j, False)).astype(jnp.float32)
        out[part][f"alpha_{j}"] = (jnp.sum(alpha * mask), jnp.sum(mask))
        out[part][f"top1_step{j}"] = (jnp.sum(top1 * mask), jnp.sum(mask))
        if j == 1:
          out[part]["target_entropy"] = (jnp.sum(entropy * mask), jnp.sum(mask))
    return out

  return jax.jit(fn)


def score(fn, trainable, frozen, full_head, parts: dict[str, Windows], batch: int) -> dict:
  """{part: metrics} of `agreement_fn` over every window, one pass for all parts (the same windows
  with different response flags), with the K = 4 chain's simulated tau from the greedy agreements
  (`tau_greedy`) and from the acceptance probabilities (`tau_sampled`)."""
  first = next(iter(parts.values()))
  sums: dict[tuple[str, str], np.ndarray] = {}
  for lo in range(0, first.n_windows, batch):
    ids = np.arange(lo, min(lo + batch, first.n_windows))
    responses = {part: w.batch(ids).response for part, w in parts.items()}
    for part, metrics in fn(trainable, frozen, full_head, first.batch(ids), responses).items():
      for k, (h, c) in metrics.items():
        sums[part, k] = sums.get((part, k), np.zeros(2)) + np.asarray([h, c], np.float64)
  out = {}
  for part in parts:
    r = {k: float(h / max(c, 1.0)) for (p, k), (h, c) in sums.items() if p == part}
    r["positions"] = int(sums[part, "top1_step1"][1])
    r["tau_greedy"] = simulated_tau({k: v for k, v in r.items() if k.startswith("top1")})
    alphas = {f"top1_step{k[6:]}": v for k, v in r.items() if k.startswith("alpha_")}
    r["tau_sampled"] = simulated_tau(alphas)
    out[part] = r
  return out


def main(_):
  t0 = time.time()
  params, cfg, tok = load_model(SMOLLM2)
  shipped = load_shipped(_HEAD.value, params, cfg)
  if shipped.kind != "eagle":
    raise SystemExit(f"--head={_HEAD.value} is a {shipped.kind!r} drafter; give an EAGLE head")
  o = {"kind": "eagle", **shipped.metadata["config"], "init_from": _HEAD.value}
  objective = make_objective(o, cfg)
  trainable, frozen = objective.init(None, params, cfg, np.asarray(shipped.params.d2t))
  layers = tuple(objective.fuse_layers)
  fn = agreement_fn(objective, _TEMP.value)
  full_head = output_matrix(params).astype(jnp.float32)
  heldout = [d for d in corpus.load_documents(SMOLLM2_CORPUS) if d.heldout][: _DOCS.value]
  print(
    f"{len(heldout)} held-out prompts of {os.path.basename(SMOLLM2_CORPUS)}; head {_HEAD.value}"
  )
  t = time.time()
  sampled = sampled_documents(
    params, cfg, heldout, _MAX_NEW.value, _BATCH.value, _TEMP.value, _SEED.value, tok.stop_ids
  )
  n_sampled = sum(len(d.tokens) - d.prompt_len for d in sampled)
  print(f"sampled {n_sampled} response tokens at T={_TEMP.value} in {time.time() - t:.0f} s")
  variants = {"greedy": greedy_documents(heldout, _MAX_NEW.value), "sampled": sampled}
  rows = {}
  with tempfile.TemporaryDirectory() as tmp:
    for name, docs in variants.items():
      out = os.path.join(tmp, name)
      teacher_forced.build(docs, out, params, cfg, layers, log=lambda _: None)
      store = FeatureStore.open(out)
      seq = -(-max(len(d.tokens) for d in docs) // 64) * 64
      w = Windows(store, seq, heldout=True, with_layers=bool(layers))
      parts = {"all": w, "first": w.first_response_tokens(_FIRST.value)}
      rows[name] = score(fn, trainable, frozen, full_head, parts, 4)
  steps = range(1, objective.steps + 1)
  keys = ["target_entropy"] + [f"alpha_{j}" for j in steps] + ["tau_sampled"]
  keys += [f"top1_step{j}" for j in steps] + ["tau_greedy"]
  print(f"\n| context | positions | {' | '.join(keys)} |")
  print("|---|---:|" + "---:|" * len(keys))
  for part, label in (("all", "all response positions"), ("first", f"first {_FIRST.value} tokens")):
    for name in variants:
      r = rows[name][part]
      vals = " | ".join(f"{r[k]:.3f}" for k in keys)
      print(f"| {name}, {label} | {r['positions']} | {vals} |")
  print(f"\n(T = {_TEMP.value}; {time.time() - t0:.0f} s in all; load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
  app.run(main)
