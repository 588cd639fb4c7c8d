"""Training-state checkpoints through orbax-checkpoint (0.12.8 `CheckpointManager` API).

Saves are synchronous and atomic (orbax writes a temporary directory and renames it when
complete), so a process killed at any moment leaves the previous checkpoints intact; restore is
against an abstract tree (`jax.eval_shape` of the initial state), which fixes structure, shapes
and dtypes.
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp


class Checkpointer:
  """Periodic training-state checkpoints in one directory.

  Args:
    directory: where step directories are written.
    max_to_keep: how many recent checkpoints survive.
  """

  def __init__(self, directory: str, max_to_keep: int = 2):
    options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True
    )
    self._manager = ocp.CheckpointManager(os.path.abspath(directory), options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any) -> None:
    self._manager.save(step, args=ocp.args.StandardSave(state))
    self._manager.wait_until_finished()

  def restore(self, abstract_state: Any, step: int | None = None) -> Any:
    """The state saved at `step` (default: the latest), shaped like `abstract_state`."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError("no checkpoint to restore")
    return self._manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

  def close(self) -> None:
    self._manager.close()
