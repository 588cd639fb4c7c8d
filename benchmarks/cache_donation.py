"""Would donating buffers to the compiled decode loops save anything? What XLA says, per loop.

Donation (`jax.jit(..., donate_argnums=...)`) lets XLA reuse an input buffer for an output, which
saves a copy and memory when a large array goes into a jitted call and a same-sized one comes out.
This script compiles each decode loop (AR, chain with prompt lookup, chain with a draft model, a
static token tree, SMC-SD) for SmolLM2-135M-shaped weights from abstract shapes (nothing is
allocated or run), and prints from XLA's memory analysis of the compiled executable:

- argument bytes: what goes in (the weights, prompts, budgets, key);
- output bytes: what comes out (tokens, lengths, metrics);
- temp bytes: what the executable allocates for itself (the KV caches, the token buffer, ...);
- cache-sized copies: `copy` instructions in the compiled HLO whose shape is a whole KV cache,
  outside the loop (the entry computation: once per call) / inside other computations (the loop
  body and what it calls: once per step or more).

A loop whose cache is a temporary (allocated by its own prefill, dropped when the loop ends) and
whose outputs are token-sized has nothing to donate: no input buffer could become an output, and
the weights are read again by the next call. The places where a cache does cross a jit boundary,
the adaptive cost calibration (`specjax/experiment/calibrate.py`) and the corpus engine
(`train/corpus.py`), donate it.

    python benchmarks/cache_donation.py                 # batch 1 and 8, 256-token prompts, 64 new
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.verify_cost import SMOLLM2_135M  # noqa: E402
from specjax import generate, smc, speculative, tree_speculative  # noqa: E402
from specjax.acceptance import GreedyRule  # noqa: E402
from specjax.drafters import DraftModelDrafter, PromptLookupDrafter  # noqa: E402
from specjax.drafters.tree_draft_model import StaticTreeDrafter  # noqa: E402
from specjax.generate import GenerateConfig  # noqa: E402
from specjax.model import init_params  # noqa: E402
from specjax.tree_acceptance import TreeGreedyRule  # noqa: E402
from specjax.trees import default_static_tree  # noqa: E402


def _abstract(tree):
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def loops(batch: int, width: int, max_new: int):
  """(name, jitted loop, abstract args, static args) of every decode loop at one batch size."""
  cfg = SMOLLM2_135M
  params = _abstract(jax.eval_shape(functools.partial(init_params, cfg=cfg), jax.random.PRNGKey(0)))
  dcfg = cfg.replace(n_layers=2)
  draft = _abstract(jax.eval_shape(functools.partial(init_params, cfg=dcfg), jax.random.PRNGKey(0)))
  prompts = jax.ShapeDtypeStruct((batch, width), jnp.int32)
  lens = jax.ShapeDtypeStruct((batch,), jnp.int32)
  key = jax.ShapeDtypeStruct((2,), jnp.uint32)
  greedy = GenerateConfig(max_new_tokens=max_new)
  common = (prompts, lens, lens, key)
  sampled = smc.SMCConfig(n_particles=4, max_new_tokens=max_new)
  smc_lens = jax.ShapeDtypeStruct((batch,), jnp.int32)
  tree = StaticTreeDrafter(dcfg, default_static_tree(16, 4))
  return [
    ("ar", generate._generate, (params, *common), (cfg, greedy)),
    (
      "chain, prompt lookup K=4",
      speculative._speculative,
      (params, (), *common),
      (cfg, PromptLookupDrafter(4), GreedyRule(), greedy, None, None),
    ),
    (
      "chain, 2-layer draft model K=4",
      speculative._speculative,
      (params, draft, *common),
      (cfg, DraftModelDrafter(dcfg, 4), GreedyRule(), greedy, None, None),
    ),
    (
      "tree, 16-node static tree",
      tree_speculative._tree_speculative,
      (params, draft, *common),
      (cfg, tree, TreeGreedyRule(), greedy, None, None),
    ),
    (
      "SMC-SD, 4 particles, gamma 4",
      smc._smc,
      (params, draft, prompts, lens, smc_lens, key),
      (cfg, DraftModelDrafter(dcfg, 4), sampled),
    ),
  ]


def cache_shapes(batch: int, rows: int) -> list[str]:
  cfg = SMOLLM2_135M
  return [f"f32[{n},{b}," for n in (cfg.n_layers, 2) for b in (batch, rows)]


def analyse(name, fn, args, static, batch: int, particles: int) -> dict:
  compiled = fn.lower(*args, *static).compile()
  mem = compiled.memory_analysis()
  hlo = compiled.as_text()
  shapes = cache_shapes(batch, batch * particles)
  entry = inner = 0  # cache-sized copies in the entry computation / in any other (loop bodies...)
  in_entry = False
  for ln in hlo.splitlines():
    if ln.startswith("ENTRY"):
      in_entry = True
    elif ln and not ln.startswith(" ") and ln.rstrip().endswith("{"):
      in_entry = False
    result = ln.split("=", 1)[1] if "=" in ln else ""
    if " copy(" in ln and any(result.lstrip().startswith(sh) for sh in shapes):
      entry, inner = entry + in_entry, inner + (not in_entry)
  return dict(
    loop=name,
    argument_mb=mem.argument_size_in_bytes / 2**20,
    output_mb=mem.output_size_in_bytes / 2**20,
    alias_mb=mem.alias_size_in_bytes / 2**20,
    temp_mb=mem.temp_size_in_bytes / 2**20,
    copies=f"{entry} / {inner}",
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batches", default="1,8")
  parser.add_argument("--width", type=int, default=256)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  args = parser.parse_args()
  print(
    f"SmolLM2-135M shapes, float32, prompt width {args.width}, {args.max_new_tokens} new tokens"
  )
  print(
    "| batch | loop | arguments MiB | outputs MiB | aliased MiB | temporaries MiB | cache-sized copies outside / inside |"
  )
  print("|---:|---|---:|---:|---:|---:|---:|")
  for b in (int(x) for x in args.batches.split(",")):
    for name, fn, a, static in loops(b, args.width, args.max_new_tokens):
      r = analyse(name, fn, a, static, b, 4 if name.startswith("SMC") else 1)
      print(
        f"| {b} | {r['loop']} | {r['argument_mb']:.1f} | {r['output_mb']:.3f} | "
        f"{r['alias_mb']:.1f} | {r['temp_mb']:.1f} | {r['copies']} |",
        flush=True,
      )


if __name__ == "__main__":
  main()
