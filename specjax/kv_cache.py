"""Per-row key/value cache.

Every row of a batch owns its own length: rows advance by different amounts once speculation lands,
so writes are a vmapped `lax.dynamic_update_slice` at each row's own offset, and rolling a row back
is setting its length. Slots at or beyond a row's length are stale: attention masks them out and they
are overwritten by the next write, never read.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Keys and values of every layer, and each row's number of valid slots.

  Attributes:
    k: [L, B, S, Hkv, Dh] keys (RoPE applied).
    v: [L, B, S, Hkv, Dh] values.
    lengths: [B] int32, valid slots per row; slot index == token position.
  """

  k: jax.Array
  v: jax.Array
  lengths: jax.Array

  @property
  def capacity(self) -> int:
    return self.k.shape[2]

  @property
  def batch(self) -> int:
    return self.k.shape[1]

  def with_lengths(self, lengths: jax.Array) -> "KVCache":
    """Returns the cache with new per-row lengths (rollback or commit; contents untouched)."""
    return dataclasses.replace(self, lengths=jnp.asarray(lengths, jnp.int32))

  def take_rows(self, rows: jax.Array) -> "KVCache":
    """Gathers rows (e.g. to fork or resample particles): row i of the result is row rows[i]."""
    return KVCache(self.k[:, rows], self.v[:, rows], self.lengths[rows])


def init_cache(cfg: ModelConfig, batch: int, capacity: int, dtype=None) -> KVCache:
  """An empty cache with `capacity` slots per row."""
  shape = (cfg.n_layers, batch, capacity, cfg.n_kv_heads, cfg.head_dim)
  dtype = dtype or cfg.jnp_dtype
  return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch,), jnp.int32))


def write_rows(buf: jax.Array, new: jax.Array, starts: jax.Array) -> jax.Array:
  """Writes new[b] into buf[b] at offset starts[b] along axis 1 of each row.

  Args:
    buf: [B, S, ...] destination.
    new: [B, T, ...] values.
    starts: [B] int32 offsets.

  Returns:
    The updated buffer. The caller guarantees starts[b] + T <= S (dynamic_update_slice would clamp).
  """

  def one(b, n, s):
    return jax.lax.dynamic_update_slice(b, n.astype(b.dtype), (s,) + (0,) * (b.ndim - 1))

  return jax.vmap(one)(buf, new, starts)


def read_rows(buf: jax.Array, starts: jax.Array, size: int) -> jax.Array:
  """Reads buf[b, starts[b] : starts[b] + size] for every row: [B, size, ...]."""

  def one(b, s):
    return jax.lax.dynamic_slice(b, (s,) + (0,) * (b.ndim - 1), (size,) + b.shape[1:])

  return jax.vmap(one)(buf, starts)


def compact_path(cache: KVCache, base: jax.Array, path: jax.Array) -> KVCache:
  """Moves the K/V at slots base + path[:, j] to base + j on every layer (per row).

  Args:
    cache: [L, B, S, ...] keys and values; lengths untouched.
    base: [B] slot of node 0 (the root) in each row.
    path: [B, P] node ids, path[:, 0] = 0.

  Returns:
    The cache with the path's entries contiguous from `base`. Gathers before it scatters, so
    overlapping sources and destinations are fine; slots past the committed length get junk.
  """
  B, P = path.shape
  rows = jnp.arange(B)[:, None]
  src = base[:, None] + path
  dst = base[:, None] + jnp.arange(P, dtype=jnp.int32)[None, :]

  def move(buf):
    return buf.at[:, rows, dst].set(buf[:, rows, src], mode="promise_in_bounds")

  return KVCache(move(cache.k), move(cache.v), cache.lengths)
