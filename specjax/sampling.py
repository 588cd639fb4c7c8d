"""Sampling as pure functions over logits.

`SamplingConfig.logprobs` returns the *processed* distribution (temperature, top-k, top-p applied),
which speculative acceptance rules compare between target and drafter; `sample` draws from it.
Temperature 0 means greedy: the processed distribution is a point mass on the argmax.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How logits become a next-token distribution. Frozen and hashable (a static argument).

  Attributes:
    temperature: 0 for greedy; otherwise logits are divided by it.
    top_k: keep the k most likely tokens (0 disables; ties at the k-th value are kept).
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1.0 disables).
  """

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  def logprobs(self, logits: jax.Array) -> jax.Array:
    """Log of the processed distribution, [..., V] float32 (-inf outside the support)."""
    logits = logits.astype(jnp.float32)
    if self.greedy:
      onehot = jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=bool)
      return jnp.where(onehot, 0.0, NEG_INF)
    logits = logits / self.temperature
    if self.top_k:
      kth = jax.lax.top_k(logits, self.top_k)[0][..., -1:]
      logits = jnp.where(logits < kth, NEG_INF, logits)
    if self.top_p < 1.0:
      logits = _top_p_filter(logits, self.top_p)
    return jax.nn.log_softmax(logits, -1)

  def sample(self, key: jax.Array, logits: jax.Array) -> jax.Array:
    """Draws tokens [...] int32 from the processed distribution."""
    return self.draw(key, self.logprobs(logits))

  def draw(self, key: jax.Array, logprobs: jax.Array) -> jax.Array:
    """Draws tokens [...] int32 from log-probabilities this config already processed
    (`logprobs`): the point mass's token when greedy, else a categorical draw. Every sampler in
    specjax (target and drafters) draws through here."""
    if self.greedy:
      return jnp.argmax(logprobs, -1).astype(jnp.int32)
    return sample_from_logprobs(key, logprobs)


def _top_p_filter(logits: jax.Array, top_p: float) -> jax.Array:
  """Masks tokens outside the nucleus: keep a token if the mass strictly before it is < top_p."""
  order = jnp.argsort(-logits, -1)
  sorted_logits = jnp.take_along_axis(logits, order, -1)
  probs = jax.nn.softmax(sorted_logits, -1)
  mass_before = jnp.cumsum(probs, -1) - probs
  keep_sorted = mass_before < top_p
  inverse = jnp.argsort(order, -1)
  keep = jnp.take_along_axis(keep_sorted, inverse, -1)
  return jnp.where(keep, logits, NEG_INF)


def sample_from_logprobs(key: jax.Array, logprobs: jax.Array) -> jax.Array:
  """Draws from an already processed distribution given as log-probabilities (-inf allowed)."""
  return jax.random.categorical(key, logprobs, -1).astype(jnp.int32)
