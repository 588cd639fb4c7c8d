"""Multi-process start-up: `jax.distributed.initialize` from absl flags, and a mesh smoke test.

Every process of a multi-host job runs the same program. After `initialize_from_flags()`
`jax.devices()` lists the devices of all processes, `MeshConfig(...).build()` spans them, and the
compiled decode loops run unchanged (XLA inserts the cross-host collectives). Each process must feed
the same prompts and weights: `jax.device_put` of a host array the same on every process, or
`specjax.sharding.shard_host_params`, which reads only the slices a process's devices hold.

TPU slice (e.g. v5e-16: 4 hosts x 4 chips). The TPU runtime tells JAX its peers, so no addresses:

  gcloud compute tpus tpu-vm ssh NAME --zone=ZONE --worker=all --command="cd specjax && \
    python -m specjax.distributed --auto_distributed --mesh=1,-1"

One multi-GPU node (8 GPUs). A single process drives every local GPU; nothing to initialise:

  python -m specjax.distributed --mesh=1,8

One process per GPU, or several nodes (here 2 nodes x 8 GPUs with Slurm, one task per GPU; under
Slurm `--auto_distributed` alone also works, JAX reads the SLURM_* variables):

  srun --ntasks-per-node=8 python -m specjax.distributed \
    --coordinator_address=$MASTER_HOST:12355 --num_processes=$SLURM_NTASKS \
    --process_id=$SLURM_PROCID --local_device_ids=$SLURM_LOCALID --mesh=2,8

Keep "tensor" within a node (or a TPU slice's ICI domain): tensor parallelism all-reduces
activations in every layer, data parallelism communicates only the loop's done flags.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import jax
from absl import app, flags
from jax.sharding import NamedSharding, PartitionSpec

_COORDINATOR = flags.DEFINE_string(
  "coordinator_address", "", "host:port of process 0 (multi-process runs without auto-detection)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 1, "Total processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "This process's index in [0, num_processes).")
_LOCAL_DEVICES = flags.DEFINE_list(
  "local_device_ids", [], "Device ids this process drives (default: all visible ones)."
)
_AUTO = flags.DEFINE_bool(
  "auto_distributed",
  False,
  "Call jax.distributed.initialize() with cluster auto-detection (TPU, Slurm).",
)
_MESH = flags.DEFINE_list("mesh", ["1", "-1"], "Mesh shape over (data, tensor); one -1 fills up.")
_SMOKE_DECODE = flags.DEFINE_bool(
  "smoke_decode", False, "Also decode greedily with a tiny random model sharded over the mesh."
)


def initialize(
  coordinator_address: str = "",
  num_processes: int = 1,
  process_id: int = 0,
  local_device_ids: Sequence[int] = (),
  auto: bool = False,
) -> bool:
  """Joins a multi-process job; returns whether `jax.distributed.initialize` was called.

  A single process without `auto` is left alone (one host with all its devices needs nothing).
  """
  if auto:
    jax.distributed.initialize()
    return True
  if num_processes <= 1 and not coordinator_address:
    return False
  if not coordinator_address:
    raise ValueError("num_processes > 1 needs --coordinator_address (or --auto_distributed)")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"process_id {process_id} is not in [0, {num_processes})")
  jax.distributed.initialize(
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
    local_device_ids=list(local_device_ids) or None,
  )
  return True


def initialize_from_flags() -> bool:
  """`initialize` with this module's absl flags (call at the top of an entry point's main)."""
  return initialize(
    _COORDINATOR.value,
    _NUM_PROCESSES.value,
    _PROCESS_ID.value,
    [int(i) for i in _LOCAL_DEVICES.value],
    _AUTO.value,
  )


def describe() -> dict:
  """This process's view of the job (for logs)."""
  return {
    "process": jax.process_index(),
    "processes": jax.process_count(),
    "local_devices": jax.local_device_count(),
    "devices": jax.device_count(),
    "platform": jax.devices()[0].platform,
  }


def smoke_decode(mesh) -> list[list[int]]:
  """Greedy AR tokens of a tiny random model sharded over `mesh` (the same on every process)."""
  import numpy as np

  from specjax.config import ModelConfig
  from specjax.generate import GenerateConfig, generate
  from specjax.model import init_params
  from specjax.sharding import DEFAULT_RULES, shard_batch, shard_host_params

  cfg = ModelConfig(
    vocab_size=256, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=8, ffn_dim=64
  )
  host = jax.tree.map(np.asarray, init_params(jax.random.PRNGKey(0), cfg, scale=0.5))
  params = shard_host_params(host, mesh, DEFAULT_RULES, cfg)
  prompts = (np.arange(16, dtype=np.int32).reshape(4, 4) * 7) % cfg.vocab_size
  lens = np.asarray([4, 3, 4, 2], np.int32)
  prompts, lens = shard_batch(mesh, DEFAULT_RULES, prompts, lens)
  out = generate(params, cfg, prompts, lens, GenerateConfig(max_new_tokens=6))
  gathered = jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, PartitionSpec()))(out.tokens)
  return np.asarray(gathered.addressable_data(0)).tolist()


def main(argv):
  del argv
  from specjax.sharding import MeshConfig

  initialize_from_flags()
  mesh = MeshConfig(tuple(int(s) for s in _MESH.value)).build()
  info = describe()
  # A sum over every device of the mesh: proves the processes can run collectives together.
  x = jax.device_put(
    jax.numpy.ones(mesh.devices.shape), NamedSharding(mesh, PartitionSpec("data", "tensor"))
  )
  total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))(x)
  report = {**info, "mesh": dict(mesh.shape), "sum_over_devices": float(total)}
  if _SMOKE_DECODE.value:
    report["tokens"] = smoke_decode(mesh)
  print(json.dumps(report), flush=True)


if __name__ == "__main__":
  app.run(main)
