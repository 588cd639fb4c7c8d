"""Llama-3.1-70B-Instruct with Llama-3.2-1B-Instruct as the draft model: the SMC-SD setting.

Planned for 8 devices as tensor 8 (e.g. 8 x H100 80 GB in one node, or a TPU v5p-8): every weight
matrix and the K/V heads (8) split 8 ways, ~16.5 GiB of target weights per device. 8 requests x 8
particles = 64 cache rows of 4096 slots. The 1B draft (tied embeddings) is split the same way.
Weights are read from local directories (nothing is downloaded):

  python -m specjax.deploy --config=configs/large/llama31_70b_smc.py
  python -m specjax.deploy --config=configs/large/llama31_70b_smc.py \
    --config.target.checkpoint=/data/Llama-3.1-70B-Instruct \
    --config.drafter.checkpoint=/data/Llama-3.2-1B-Instruct --config.decode.n_particles=16

Multi-host (e.g. 2 nodes x 8 GPUs, data 2 x tensor 8): see `specjax/distributed.py`.
"""

import ml_collections

from specjax.deploy import base_deployment_config


def _llama3_rope(factor: float) -> dict:
  return {
    "rope_type": "llama3",
    "factor": factor,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
  }


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  del arg
  c = base_deployment_config()
  c.name = "llama31_70b_llama32_1b_smc"
  c.target.hf_config = ml_collections.ConfigDict(
    {
      "architectures": ["LlamaForCausalLM"],
      "vocab_size": 128256,
      "hidden_size": 8192,
      "num_hidden_layers": 80,
      "num_attention_heads": 64,
      "num_key_value_heads": 8,
      "intermediate_size": 28672,
      "rms_norm_eps": 1e-5,
      "rope_theta": 500000.0,
      "rope_scaling": _llama3_rope(8.0),
      "max_position_embeddings": 131072,
      "tie_word_embeddings": False,
    }
  )
  c.drafter.kind = "draft_model"
  c.drafter.hf_config = ml_collections.ConfigDict(
    {
      "architectures": ["LlamaForCausalLM"],
      "vocab_size": 128256,
      "hidden_size": 2048,
      "num_hidden_layers": 16,
      "num_attention_heads": 32,
      "num_key_value_heads": 8,
      "head_dim": 64,
      "intermediate_size": 8192,
      "rms_norm_eps": 1e-5,
      "rope_theta": 500000.0,
      "rope_scaling": _llama3_rope(32.0),
      "max_position_embeddings": 131072,
      "tie_word_embeddings": True,
    }
  )
  c.drafter.k = 4  # gamma: tokens drafted per particle per cycle
  c.mesh.shape = (1, 8)
  c.decode.batch = 8
  c.decode.n_particles = 8
  c.decode.capacity = 4096
  c.decode.temperature = 1.0
  c.lock()
  return c
