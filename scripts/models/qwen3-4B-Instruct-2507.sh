# shellcheck shell=bash
# Megatron architecture flags for Qwen/Qwen3-4B-Instruct-2507 (Megatron cannot read them from a checkpoint).
# Each value is the model's config.json field named beside it. They agree with slime's
# scripts/models/qwen3-4B-Instruct-2507.sh at 624b824, which reuses qwen3-4B.sh with --rotary-base 5000000: the one
# value in which Instruct-2507 differs from Qwen3-4B. This copy lets a dry run print the exact command where slime is
# not installed, and tests/test_scripts.py checks every flag against Megatron's parser. To use slime's file (or
# another model), set MODEL_ARGS_SCRIPT to its path.
# shellcheck disable=SC2034  # MODEL_ARGS is read by the scripts that source this file
MODEL_ARGS=(
  --swiglu                             # hidden_act silu, gated MLP
  --num-layers 36                      # num_hidden_layers
  --hidden-size 2560                   # hidden_size
  --ffn-hidden-size 9728               # intermediate_size
  --num-attention-heads 32             # num_attention_heads
  --group-query-attention
  --num-query-groups 8                 # num_key_value_heads
  --kv-channels 128                    # head_dim
  --use-rotary-position-embeddings
  --rotary-base 5000000                # rope_theta
  --disable-bias-linear                # attention_bias false
  --normalization RMSNorm
  --norm-epsilon 1e-6                  # rms_norm_eps
  --qk-layernorm                       # Qwen3 q_norm / k_norm
  --vocab-size 151936                  # vocab_size; embeddings tied (tie_word_embeddings true), Megatron's default
)
