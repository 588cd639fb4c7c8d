"""Vicuna-7B v1.3 with published Medusa-1 heads (FasterDecoding/medusa-vicuna-7b-v1.3: 5 heads,
1 residual block each, an LM head per head).

Planned for one 80 GB GPU (mesh 1 x 1), batch 8, 2048 cache slots per row (Vicuna's context).
Weights are read from local directories (nothing is downloaded), from safetensors only: where the
heads come as the pickle `medusa_lm_head.pt`, convert them once to `medusa_lm_head.safetensors` (the
loader's error prints the one-line conversion):

  python -m specjax.deploy --config=configs/large/vicuna7b_medusa.py
  python -m specjax.deploy --config=configs/large/vicuna7b_medusa.py \
    --config.target.checkpoint=/data/vicuna-7b-v1.3 \
    --config.drafter.checkpoint=/data/medusa-vicuna-7b-v1.3 --config.mesh.shape=1,2
"""

import ml_collections

from specjax.deploy import base_deployment_config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  del arg
  c = base_deployment_config()
  c.name = "vicuna7b_medusa"
  c.dtype = "float16"
  c.target.hf_config = ml_collections.ConfigDict(
    {
      "architectures": ["LlamaForCausalLM"],
      "vocab_size": 32000,
      "hidden_size": 4096,
      "num_hidden_layers": 32,
      "num_attention_heads": 32,
      "num_key_value_heads": 32,
      "intermediate_size": 11008,
      "rms_norm_eps": 1e-6,
      "rope_theta": 10000.0,
      "max_position_embeddings": 2048,
      "tie_word_embeddings": False,
    }
  )
  c.drafter.kind = "medusa"
  c.drafter.n_heads = 5
  c.drafter.n_blocks = 1
  c.drafter.k = 5
  c.mesh.shape = (1, 1)
  c.decode.batch = 8
  c.decode.capacity = 2048
  c.lock()
  return c
