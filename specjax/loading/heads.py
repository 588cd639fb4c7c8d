"""Strict loaders for published speculative-head checkpoints: EAGLE-1/2, EAGLE-3 and Medusa-1.

A head checkpoint is a directory with a `config.json` and one safetensors weights file; a PyTorch
pickle in its place (`pytorch_model.bin`, `medusa_lm_head.pt`) is refused with the one-line
conversion, since loading a pickle can run code. Every expected
tensor must be present exactly once with its exact shape, nothing unexpected may remain, and the
head must fit the target (width, vocabulary, layer count); anything else raises `CheckpointError`
naming the tensor or field. Layouts (tensor names as published, our fields in parentheses):

EAGLE-1 / EAGLE-2 (SafeAILab `cnets1.py` style; `config.json` is a Llama config plus `bias`, which
defaults to true as in the reference loader):
  fc.weight [D, 2D] (w_in), fc.bias [D] (b_in, iff bias), over [embedding; target feature];
  layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.mlp.{gate,up,down}_proj.weight,
  layers.{i}.post_attention_layernorm.weight, and layers.{i}.input_layernorm.weight for i >= 1
  only (layer 0 has no input norm); optional embed_tokens.weight [V, D] (a copy of the target's).
  Tokens are scored with the target's LM head; D must equal the target's width.
EAGLE-3 (`cnets.py` style; `config.json` adds draft_vocab_size, optionally target_hidden_size and
eagle_config.eagle_aux_hidden_state_layer_ids):
  fc.weight [D, n*Dt] (fuse) over n target features of width Dt; midlayer.hidden_norm.weight
  (hidden_norm, on the feature) and midlayer.input_layernorm.weight (attn_norm, on the embedding);
  midlayer.self_attn.{q,k,v}_proj.weight [*, 2D] over [norm(embedding); norm(feature)],
  o_proj [D, H*Dh]; midlayer.post_attention_layernorm.weight (mlp_norm), midlayer.mlp.*; norm.weight
  (norm); lm_head.weight [Vd, D] (head); d2t [Vd] int offsets (target id = draft id + d2t[id],
  stored here as absolute target ids) and t2d [V] bool, both optional when Vd == V.
  The fused features are the hidden states entering decoder layers (2, L // 2, L - 3) of an
  L-layer target unless the config lists others; they are the outputs of layers
  (1, L // 2 - 1, L - 4) in `specjax.model.forward(hidden_layers=...)` terms (`target_layers`).
Medusa-1 (FasterDecoding `medusa_model.py`; `config.json` has medusa_num_heads, medusa_num_layers):
  medusa_head.{k}.{r}.linear.{weight [D, D], bias [D]} for r < R, medusa_head.{k}.{R}.weight
  [V, D] (w, b, lm_head of `MedusaHeadParams`), or the same names
  without the `medusa_head.` prefix (the medusa_lm_head file of the heads alone).

These are our own param pytrees (registered dataclasses), not the shared-head/draft-vocabulary
layouts of `specjax.drafters.eagle` and `specjax.drafters.medusa`, which cannot express a bias on
fc, a missing input norm, a 2D-wide attention input or one LM head per Medusa head. Field names
follow `specjax.deploy`'s logical names for the same tensors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

from specjax.config import ModelConfig
from specjax.loading.keymap import CheckpointError
from specjax.model import LayerParams

KINDS = ("eagle", "eagle3", "medusa")
PICKLE_TO_SAFETENSORS = {  # pickles are recognised only to be refused, naming the conversion
  "pytorch_model.bin": "model.safetensors",
  "medusa_lm_head.pt": "medusa_lm_head.safetensors",
}
WEIGHT_FILES = (*PICKLE_TO_SAFETENSORS.values(), *PICKLE_TO_SAFETENSORS)
_LAYER_NAMES = {
  "wq": "self_attn.q_proj.weight",
  "wk": "self_attn.k_proj.weight",
  "wv": "self_attn.v_proj.weight",
  "wo": "self_attn.o_proj.weight",
  "mlp_norm": "post_attention_layernorm.weight",
  "w_gate": "mlp.gate_proj.weight",
  "w_up": "mlp.up_proj.weight",
  "w_down": "mlp.down_proj.weight",
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MedusaHeadParams:
  """Medusa-1 heads in the published layout: K heads of R residual blocks and an own LM head each.

  Attributes:
    w: [K, R, D, D] residual block weights ([out, in]).
    b: [K, R, D] residual block biases.
    lm_head: [K, V, D] each head's output projection.
  """

  w: jax.Array
  b: jax.Array
  lm_head: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EagleHeadParams:
  """A published EAGLE-1/2 head.

  Attributes:
    w_in: [D, 2D] fc over [embedding; feature].
    b_in: [D] its bias, or None.
    layers: the decoder layers stacked [Ld, ...]; `attn_norm` is [Ld, D] with row 0 unused
      (layer 0 reads the fc output without an input norm; its row holds ones).
    embed: [V, D] the checkpoint's copy of the target embedding, or None.
  """

  w_in: jax.Array
  b_in: jax.Array | None
  layers: LayerParams
  embed: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Eagle3LayerParams:
  """EAGLE-3's decoder layer, whose attention reads [attn_norm(embedding); hidden_norm(feature)]."""

  attn_norm: jax.Array  # [D] on the embedding
  hidden_norm: jax.Array  # [D] on the feature
  wq: jax.Array  # [H*Dh, 2D]
  wk: jax.Array  # [Hkv*Dh, 2D]
  wv: jax.Array  # [Hkv*Dh, 2D]
  wo: jax.Array  # [D, H*Dh]
  mlp_norm: jax.Array  # [D]
  w_gate: jax.Array  # [F, D]
  w_up: jax.Array  # [F, D]
  w_down: jax.Array  # [D, F]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Eagle3HeadParams:
  """A published EAGLE-3 head.

  Attributes:
    fuse: [D, n*Dt] fc over the n concatenated target features.
    layer: the decoder layer.
    norm: [D] before the head.
    head: [Vd, D] draft-vocabulary LM head.
    d2t: [Vd] int32 absolute target id of each draft token.
    embed: [V, D] the checkpoint's copy of the target embedding, or None.
  """

  fuse: jax.Array
  layer: Eagle3LayerParams
  norm: jax.Array
  head: jax.Array
  d2t: jax.Array
  embed: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class HeadConfig:
  """Static description of a loaded head.

  Attributes:
    kind: "eagle", "eagle3" or "medusa".
    layer: the head's decoder-layer config (EAGLE; vocab_size = the target's V), or None.
    fc_bias: EAGLE-1/2 fc has a bias.
    draft_vocab_size: Vd (EAGLE-3), else the target's V.
    target_layers: target layers whose outputs an EAGLE-3 head fuses (`forward` convention).
    n_heads, n_blocks: Medusa heads and residual blocks per head.
  """

  kind: str
  layer: ModelConfig | None = None
  fc_bias: bool = False
  draft_vocab_size: int = 0
  target_layers: tuple[int, ...] = ()
  n_heads: int = 0
  n_blocks: int = 0


# ---------------------------------------------------------------- reading files


def read_head_dir(directory: str) -> tuple[dict, dict[str, np.ndarray], str]:
  """(config dict, tensors by name, weights file name) of a head checkpoint directory."""
  cfg_path = os.path.join(directory, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(f"no config.json in {directory}")
  with open(cfg_path) as f:
    config = json.load(f)
  present = [w for w in WEIGHT_FILES if os.path.exists(os.path.join(directory, w))]
  if len(present) != 1:
    found = present or sorted(os.listdir(directory))
    raise CheckpointError(f"expected exactly one of {WEIGHT_FILES} in {directory}, found {found}")
  path = os.path.join(directory, present[0])
  if not present[0].endswith(".safetensors"):
    converted = PICKLE_TO_SAFETENSORS[present[0]]
    raise CheckpointError(
      f"{path} is a PyTorch pickle; specjax reads weights from safetensors only (loading a pickle "
      'can run code). Convert it once, where you trust the file: python -c "import torch; '
      "from safetensors.torch import save_file; "
      f"save_file(torch.load('{present[0]}', weights_only=True), '{converted}')\" in {directory}, "
      "then remove the pickle"
    )
  return config, dict(load_file(path)), present[0]


def detect_kind(names) -> str | None:
  """Which published format a set of tensor names is, from its distinctive names."""
  names = set(names)
  if any(n.startswith("midlayer.") for n in names):
    return "eagle3"
  if "fc.weight" in names and any(n.startswith("layers.") for n in names):
    return "eagle"
  if names and all(re.match(r"(medusa_head\.)?\d+\.\d+\.", n) for n in names):
    return "medusa"
  return None


class _Strict:
  """Takes tensors by name, checking shapes, and reports anything left over."""

  def __init__(self, tensors: dict[str, np.ndarray], source: str):
    self.tensors, self.source, self.taken = tensors, source, set()

  def take(self, name: str, shape: tuple[int, ...], why: str = "") -> np.ndarray:
    if name not in self.tensors:
      raise CheckpointError(f"{self.source} is missing tensor {name!r}{why}")
    arr = np.asarray(self.tensors[name])
    if tuple(arr.shape) != tuple(shape):
      raise CheckpointError(
        f"tensor {name!r} has shape {tuple(arr.shape)}, expected {tuple(shape)}"
      )
    self.taken.add(name)
    return arr

  def maybe(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    return self.take(name, shape) if name in self.tensors else None

  def finish(self, hint: str = "") -> None:
    extra = sorted(set(self.tensors) - self.taken)
    extra = [n for n in extra if not n.endswith("rotary_emb.inv_freq")]
    if extra:
      raise CheckpointError(f"unexpected tensor(s) {extra[:5]} in {self.source}{hint}")


def _layer_config(c: dict, target: ModelConfig, dtype: str) -> ModelConfig:
  c = {k: v for k, v in c.items() if k != "architectures"}  # EAGLE-3 names its own class
  cfg = ModelConfig.from_hf_dict(c, dtype=dtype)
  if cfg.vocab_size != target.vocab_size:
    raise CheckpointError(
      f"head vocab_size {cfg.vocab_size} != the target's {target.vocab_size}; wrong target?"
    )
  return cfg


def _f(arr, dtype):
  return None if arr is None else jnp.asarray(arr, dtype)


def _check_kind(tensors, want: str, source: str) -> None:
  got = detect_kind(tensors)
  if got != want:
    what = f"a {got} checkpoint" if got else "no recognised head format"
    raise CheckpointError(f"{source} holds {what} (tensor names {sorted(tensors)[:3]}), not {want}")


# ---------------------------------------------------------------- EAGLE-1 / EAGLE-2


def load_eagle(directory: str, target: ModelConfig, dtype: str = "float32"):
  """Loads a published EAGLE-1/2 head: (EagleHeadParams, HeadConfig)."""
  config, tensors, file = read_head_dir(directory)
  source = os.path.join(directory, file)
  _check_kind(tensors, "eagle", source)
  cfg = _layer_config(config, target, dtype)
  if cfg.d_model != target.d_model:
    raise CheckpointError(f"head hidden_size {cfg.d_model} != the target's {target.d_model}")
  bias = bool(config.get("bias", True))
  D, F, V, L = cfg.d_model, cfg.ffn_dim, cfg.vocab_size, cfg.n_layers
  q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
  s = _Strict(tensors, source)
  w_in = s.take("fc.weight", (D, 2 * D))
  b_in = None
  if bias:
    b_in = s.take("fc.bias", (D,), " (config.json has bias=true or no bias field, the default)")
  shapes = {"wq": (q, D), "wk": (kv, D), "wv": (kv, D), "wo": (D, q), "mlp_norm": (D,)}
  shapes |= {"w_gate": (F, D), "w_up": (F, D), "w_down": (D, F)}
  fields: dict[str, Any] = {k: [] for k in shapes}
  norms = [np.ones((D,), np.float32)]
  for i in range(L):
    for k, name in _LAYER_NAMES.items():
      fields[k].append(s.take(f"layers.{i}.{name}", shapes[k]))
    if i:
      norms.append(s.take(f"layers.{i}.input_layernorm.weight", (D,)))
  if cfg.qkv_bias:
    raise CheckpointError("EAGLE heads with q/k/v biases are not supported")
  embed = s.maybe("embed_tokens.weight", (V, D))
  hint = ""
  if "fc.bias" in tensors and not bias:
    hint = " (config.json says bias=false)"
  if "layers.0.input_layernorm.weight" in tensors:
    hint = " (EAGLE-1/2 layer 0 has no input norm)"
  s.finish(hint)
  layers = LayerParams(
    attn_norm=_f(np.stack(norms), cfg.jnp_dtype),
    **{k: _f(np.stack(v), cfg.jnp_dtype) for k, v in fields.items()},
  )
  params = EagleHeadParams(
    _f(w_in, cfg.jnp_dtype), _f(b_in, cfg.jnp_dtype), layers, _f(embed, cfg.jnp_dtype)
  )
  return params, HeadConfig("eagle", layer=cfg, fc_bias=bias, draft_vocab_size=V)


# ---------------------------------------------------------------- EAGLE-3


def eagle3_target_layers(config: dict, target: ModelConfig) -> tuple[int, ...]:
  """Target layers (forward's `hidden_layers` convention) whose outputs an EAGLE-3 head fuses."""
  ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
  ids = ids if ids is not None else config.get("eagle_aux_hidden_state_layer_ids")
  L = target.n_layers
  if ids is None:
    ids = [2, L // 2, L - 3]  # the reference implementation's default capture points
  ids = [int(i) for i in ids]
  if any(not 1 <= i <= L for i in ids):
    raise CheckpointError(
      f"EAGLE-3 layer ids {ids} must be in 1 .. {L} (the input of decoder layer i; 0, the "
      "embedding, is not supported)"
    )
  return tuple(i - 1 for i in ids)


def load_eagle3(directory: str, target: ModelConfig, dtype: str = "float32"):
  """Loads a published EAGLE-3 head: (Eagle3HeadParams, HeadConfig)."""
  config, tensors, file = read_head_dir(directory)
  source = os.path.join(directory, file)
  _check_kind(tensors, "eagle3", source)
  cfg = _layer_config(config, target, dtype)
  if cfg.n_layers != 1:
    raise CheckpointError(f"an EAGLE-3 head has one layer, config.json says {cfg.n_layers}")
  Dt = int(config.get("target_hidden_size", cfg.d_model))
  if Dt != target.d_model:
    raise CheckpointError(f"head target_hidden_size {Dt} != the target's width {target.d_model}")
  layers = eagle3_target_layers(config, target)
  D, F, V = cfg.d_model, cfg.ffn_dim, cfg.vocab_size
  Vd = int(config.get("draft_vocab_size", V))
  q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
  s = _Strict(tensors, source)
  m = "midlayer."
  layer = {
    "attn_norm": s.take(m + "input_layernorm.weight", (D,)),
    "hidden_norm": s.take(m + "hidden_norm.weight", (D,)),
    "wq": s.take(m + _LAYER_NAMES["wq"], (q, 2 * D)),
    "wk": s.take(m + _LAYER_NAMES["wk"], (kv, 2 * D)),
    "wv": s.take(m + _LAYER_NAMES["wv"], (kv, 2 * D)),
    "wo": s.take(m + _LAYER_NAMES["wo"], (D, q)),
    "mlp_norm": s.take(m + _LAYER_NAMES["mlp_norm"], (D,)),
    "w_gate": s.take(m + _LAYER_NAMES["w_gate"], (F, D)),
    "w_up": s.take(m + _LAYER_NAMES["w_up"], (F, D)),
    "w_down": s.take(m + _LAYER_NAMES["w_down"], (D, F)),
  }
  fuse = s.take("fc.weight", (D, len(layers) * Dt), f" ({len(layers)} fused target layers)")
  norm = s.take("norm.weight", (D,))
  head = s.take("lm_head.weight", (Vd, D), f" (draft_vocab_size {Vd})")
  d2t = _draft_to_target(s, Vd, V)
  embed = s.maybe("embed_tokens.weight", (V, D))
  s.finish(" (fc.bias? an EAGLE-3 fc has no bias)" if "fc.bias" in tensors else "")
  dt = cfg.jnp_dtype
  params = Eagle3HeadParams(
    _f(fuse, dt),
    Eagle3LayerParams(**{k: _f(v, dt) for k, v in layer.items()}),
    _f(norm, dt),
    _f(head, dt),
    jnp.asarray(d2t, jnp.int32),
    _f(embed, dt),
  )
  return params, HeadConfig("eagle3", layer=cfg, draft_vocab_size=Vd, target_layers=layers)


def _draft_to_target(s: _Strict, Vd: int, V: int) -> np.ndarray:
  """Absolute target ids [Vd] from the offset table d2t, checked against t2d when present."""
  has_d2t, has_t2d = "d2t" in s.tensors, "t2d" in s.tensors
  if not has_d2t:
    if Vd != V:
      raise CheckpointError(f"{s.source} has no d2t but draft_vocab_size {Vd} != vocab_size {V}")
    if has_t2d:
      raise CheckpointError(f"{s.source} has t2d without d2t")
    return np.arange(V, dtype=np.int32)
  offsets = s.take("d2t", (Vd,))
  if not np.issubdtype(offsets.dtype, np.integer):
    raise CheckpointError(f"d2t must hold integer offsets, got {offsets.dtype}")
  ids = np.arange(Vd, dtype=np.int64) + offsets.astype(np.int64)
  if ids.min() < 0 or ids.max() >= V or len(np.unique(ids)) != Vd:
    raise CheckpointError(
      "d2t does not map the draft vocabulary to distinct target ids in 0 .. V-1"
    )
  if has_t2d:
    t2d = s.take("t2d", (V,))
    expect = np.zeros(V, bool)
    expect[ids] = True
    if t2d.dtype != np.bool_ or not np.array_equal(t2d, expect):
      raise CheckpointError("t2d is not the boolean indicator of the target ids listed by d2t")
  elif Vd != V:
    raise CheckpointError(f"{s.source} has d2t but no t2d")
  return ids.astype(np.int32)


# ---------------------------------------------------------------- Medusa


def load_medusa(directory: str, target: ModelConfig, dtype: str = "float32"):
  """Loads published Medusa-1 heads: (MedusaHeadParams, HeadConfig)."""
  config, tensors, file = read_head_dir(directory)
  source = os.path.join(directory, file)
  _check_kind(tensors, "medusa", source)
  for key in ("medusa_num_heads", "medusa_num_layers"):
    if key not in config:
      raise CheckpointError(f"config.json of a Medusa head needs {key!r}")
  K, R = int(config["medusa_num_heads"]), int(config["medusa_num_layers"])
  D, V = target.d_model, target.vocab_size
  for key, want in (("hidden_size", D), ("vocab_size", V)):
    if key in config and int(config[key]) != want:
      raise CheckpointError(f"Medusa config {key} {config[key]} != the target's {want}")
  prefixed = {n.startswith("medusa_head.") for n in tensors}
  if len(prefixed) != 1:
    raise CheckpointError(f"{source} mixes names with and without the 'medusa_head.' prefix")
  pre = "medusa_head." if prefixed.pop() else ""
  s = _Strict(tensors, source)
  w = [[s.take(f"{pre}{k}.{r}.linear.weight", (D, D)) for r in range(R)] for k in range(K)]
  b = [[s.take(f"{pre}{k}.{r}.linear.bias", (D,)) for r in range(R)] for k in range(K)]
  head = [s.take(f"{pre}{k}.{R}.weight", (V, D)) for k in range(K)]
  s.finish(f" (config.json: medusa_num_heads={K}, medusa_num_layers={R})")
  dt = jnp.dtype(dtype)
  params = MedusaHeadParams(
    jnp.asarray(np.array(w), dt), jnp.asarray(np.array(b), dt), jnp.asarray(np.array(head), dt)
  )
  return params, HeadConfig("medusa", draft_vocab_size=V, n_heads=K, n_blocks=R)


_LOADERS = {"eagle": load_eagle, "eagle3": load_eagle3, "medusa": load_medusa}


def load_head(directory: str, target: ModelConfig, kind: str | None = None, dtype: str = "float32"):
  """Loads a published head checkpoint of `kind` (detected from tensor names when None).

  Args:
    directory: the head's directory (config.json and one weights file).
    target: the config of the target the head was trained for.
    kind: "eagle" (EAGLE-1/2), "eagle3" or "medusa"; a mismatch with the file is an error.
    dtype: float dtype of the returned arrays.

  Returns:
    (params, HeadConfig).

  Raises:
    CheckpointError: wrong kind, missing/unexpected/mis-shaped tensors, or a head that does not fit
      the target.
  """
  if kind is None:
    _, tensors, _ = read_head_dir(directory)
    kind = detect_kind(tensors)
    if kind is None:
      raise CheckpointError(f"{directory} holds no recognised head format ({sorted(tensors)[:3]})")
  if kind not in _LOADERS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  return _LOADERS[kind](directory, target, dtype)
