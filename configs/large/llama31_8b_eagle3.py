"""Llama-3.1-8B-Instruct with the published EAGLE-3 head (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B).

Planned for 8 devices as data 2 x tensor 4 (e.g. a TPU v5e-8, 16 GiB per chip: the bf16 target
alone is 15 GiB), batch 16, 4096 cache slots per row. Weights are read from local directories;
point the two checkpoint fields at them (nothing is downloaded):

  python -m specjax.deploy --config=configs/large/llama31_8b_eagle3.py
  python -m specjax.deploy --config=configs/large/llama31_8b_eagle3.py \
    --config.target.checkpoint=/data/Llama-3.1-8B-Instruct \
    --config.drafter.checkpoint=/data/EAGLE3-LLaMA3.1-Instruct-8B --config.mesh.shape=1,8

The head's fields mirror its config.json: one decoder layer at the target's width whose attention
reads [embedding; fused feature] (2 x 4096), a draft vocabulary of 32,000 tokens with a d2t map, and
a fusion of three target layers (EAGLE-3 reads the hidden states entering layers 2, 16 and 29 of 32,
i.e. the outputs of layers 1, 15 and 28 in `forward(hidden_layers=...)` numbering).
"""

import ml_collections

from specjax.deploy import base_deployment_config

LLAMA3_ROPE = {
  "rope_type": "llama3",
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 8192,
}


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  del arg
  c = base_deployment_config()
  c.name = "llama31_8b_eagle3"
  c.target.hf_config = ml_collections.ConfigDict(
    {
      "architectures": ["LlamaForCausalLM"],
      "vocab_size": 128256,
      "hidden_size": 4096,
      "num_hidden_layers": 32,
      "num_attention_heads": 32,
      "num_key_value_heads": 8,
      "intermediate_size": 14336,
      "rms_norm_eps": 1e-5,
      "rope_theta": 500000.0,
      "rope_scaling": dict(LLAMA3_ROPE),
      "max_position_embeddings": 131072,
      "tie_word_embeddings": False,
    }
  )
  c.drafter.kind = "eagle3"
  c.drafter.hf_config = ml_collections.ConfigDict(
    {
      "architectures": ["LlamaForCausalLM"],
      "vocab_size": 128256,
      "hidden_size": 4096,
      "num_hidden_layers": 1,
      "num_attention_heads": 32,
      "num_key_value_heads": 8,
      "intermediate_size": 14336,
      "rms_norm_eps": 1e-5,
      "rope_theta": 500000.0,
      "rope_scaling": dict(LLAMA3_ROPE),
      "max_position_embeddings": 2048,
      "tie_word_embeddings": False,
    }
  )
  c.drafter.draft_vocab = 32000
  c.drafter.hidden_layers = (1, 15, 28)  # EAGLE-3 reads the inputs of layers 2, L//2, L-3
  c.drafter.k = 6
  c.mesh.shape = (2, 4)
  c.decode.batch = 16
  c.decode.capacity = 4096
  c.lock()
  return c
