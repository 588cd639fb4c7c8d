"""Declarative tensor-name maps and the strict builder that turns named arrays into `Params`.

Every expected tensor must appear exactly once with exactly its expected shape and only finite
values; any missing, unexpected, duplicated, mis-shaped or non-finite tensor raises
`CheckpointError` naming it. There is no
fallback to random weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.model import LayerParams, Params, param_shapes


class CheckpointError(ValueError):
  """A checkpoint does not match the model it is loaded into."""


# Our field -> checkpoint name ("{i}" is the layer index).
HF_NAMES = {
  "embed": "model.embed_tokens.weight",
  "final_norm": "model.norm.weight",
  "lm_head": "lm_head.weight",
  "attn_norm": "model.layers.{i}.input_layernorm.weight",
  "wq": "model.layers.{i}.self_attn.q_proj.weight",
  "wk": "model.layers.{i}.self_attn.k_proj.weight",
  "wv": "model.layers.{i}.self_attn.v_proj.weight",
  "wo": "model.layers.{i}.self_attn.o_proj.weight",
  "bq": "model.layers.{i}.self_attn.q_proj.bias",
  "bk": "model.layers.{i}.self_attn.k_proj.bias",
  "bv": "model.layers.{i}.self_attn.v_proj.bias",
  "mlp_norm": "model.layers.{i}.post_attention_layernorm.weight",
  "w_gate": "model.layers.{i}.mlp.gate_proj.weight",
  "w_up": "model.layers.{i}.mlp.up_proj.weight",
  "w_down": "model.layers.{i}.mlp.down_proj.weight",
}

GGUF_NAMES = {
  "embed": "token_embd.weight",
  "final_norm": "output_norm.weight",
  "lm_head": "output.weight",
  "attn_norm": "blk.{i}.attn_norm.weight",
  "wq": "blk.{i}.attn_q.weight",
  "wk": "blk.{i}.attn_k.weight",
  "wv": "blk.{i}.attn_v.weight",
  "wo": "blk.{i}.attn_output.weight",
  "bq": "blk.{i}.attn_q.bias",
  "bk": "blk.{i}.attn_k.bias",
  "bv": "blk.{i}.attn_v.bias",
  "mlp_norm": "blk.{i}.ffn_norm.weight",
  "w_gate": "blk.{i}.ffn_gate.weight",
  "w_up": "blk.{i}.ffn_up.weight",
  "w_down": "blk.{i}.ffn_down.weight",
}

# Checkpoint entries that carry no weights we need (e.g. precomputed RoPE tables).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

Transform = Callable[[str, np.ndarray], np.ndarray]


def build_params(
  tensors: Iterable[tuple[str, np.ndarray]],
  cfg: ModelConfig,
  names: dict[str, str],
  transform: Transform | None = None,
) -> Params:
  """Builds `Params` from (name, array) pairs, strictly.

  Args:
    tensors: every tensor of the checkpoint, in any order (a generator is fine).
    cfg: the model config the checkpoint must match.
    names: field -> checkpoint-name template (`HF_NAMES` or `GGUF_NAMES`).
    transform: optional per-tensor fix-up (name, array) -> array applied before the shape check.

  Raises:
    CheckpointError: for a missing, unexpected, duplicated, mis-shaped or non-finite tensor.
  """
  shapes = param_shapes(cfg)
  expected: dict[str, tuple[str, int | None, tuple[int, ...]]] = {}
  for field, shape in dataclasses.asdict(shapes.layers).items():
    if shape is not None:
      for i in range(cfg.n_layers):
        expected[names[field].format(i=i)] = (field, i, tuple(shape[1:]))
  for field in ("embed", "final_norm", "lm_head"):
    shape = getattr(shapes, field)
    if shape is not None:
      expected[names[field]] = (field, None, tuple(shape))

  seen: dict[str, np.ndarray] = {}
  for name, arr in tensors:
    if name.endswith(IGNORED_SUFFIXES):
      continue
    if name in seen:
      raise CheckpointError(f"tensor {name!r} appears more than once in the checkpoint")
    if name not in expected:
      hint = ""
      if name == names["lm_head"] and cfg.tie_embeddings:
        hint = " (the config says tie_word_embeddings=True, but the checkpoint has an LM head)"
      if "bias" in name and not cfg.qkv_bias:
        hint = " (the config has no q/k/v bias)"
      raise CheckpointError(f"unexpected tensor {name!r} in checkpoint{hint}")
    arr = np.asarray(arr)
    if transform is not None:
      arr = transform(name, arr)
    want = expected[name][2]
    if tuple(arr.shape) != want:
      raise CheckpointError(f"tensor {name!r} has shape {tuple(arr.shape)}, expected {want}")
    if jnp.issubdtype(arr.dtype, jnp.inexact):
      bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
      if bad:
        raise CheckpointError(
          f"tensor {name!r} has {bad} non-finite values (NaN or inf) of {arr.size}; "
          "the checkpoint is corrupt or was poisoned"
        )
    seen[name] = arr
  missing = sorted(set(expected) - set(seen))
  if missing:
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    raise CheckpointError(f"checkpoint is missing tensor(s) {missing[:5]}{more}")

  dtype = cfg.jnp_dtype
  layer_fields = {}
  for field, shape in dataclasses.asdict(shapes.layers).items():
    if shape is None:
      layer_fields[field] = None
    else:
      stack = np.stack([seen[names[field].format(i=i)] for i in range(cfg.n_layers)])
      layer_fields[field] = jnp.asarray(stack, dtype)
  return Params(
    embed=jnp.asarray(seen[names["embed"]], dtype),
    layers=LayerParams(**layer_fields),
    final_norm=jnp.asarray(seen[names["final_norm"]], dtype),
    lm_head=None if cfg.tie_embeddings else jnp.asarray(seen[names["lm_head"]], dtype),
  )
