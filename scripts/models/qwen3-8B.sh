# shellcheck shell=bash
# Megatron architecture flags for Qwen/Qwen3-8B (Megatron cannot read them from a checkpoint). Each value is the
# model's config.json field named beside it; they agree with slime's scripts/models/qwen3-8B.sh at 624b824
# (tests/test_models.py holds every flag against it). Picked by MODEL=qwen3-8b (docs/models-and-sizing.md).
# shellcheck disable=SC2034  # MODEL_ARGS is read by the scripts that source this file
MODEL_ARGS=(
  --swiglu                             # hidden_act silu, gated MLP
  --num-layers 36                      # num_hidden_layers
  --hidden-size 4096                   # hidden_size
  --ffn-hidden-size 12288              # intermediate_size
  --num-attention-heads 32             # num_attention_heads
  --group-query-attention
  --num-query-groups 8                 # num_key_value_heads
  --kv-channels 128                    # head_dim
  --use-rotary-position-embeddings
  --rotary-base 1000000                # rope_theta
  --disable-bias-linear                # attention_bias false
  --normalization RMSNorm
  --norm-epsilon 1e-6                  # rms_norm_eps
  --qk-layernorm                       # Qwen3 q_norm / k_norm
  --vocab-size 151936                  # vocab_size
  --untie-embeddings-and-output-weights  # tie_word_embeddings false
)
