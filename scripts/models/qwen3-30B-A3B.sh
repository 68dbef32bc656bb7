# shellcheck shell=bash
# Megatron architecture flags for Qwen/Qwen3-30B-A3B, a mixture of experts (Megatron cannot read them from a
# checkpoint). Each value is the model's config.json field named beside it; they agree with slime's
# scripts/models/qwen3-30B-A3B.sh at 624b824 (tests/test_models.py holds every flag against it), whose MoE settings
# (grouped GEMM, all-to-all dispatch, fp32 router, no aux loss) are kept as they are. Picked by MODEL=qwen3-30b-a3b
# (docs/models-and-sizing.md); its layouts add expert parallelism (--expert-model-parallel-size).
# shellcheck disable=SC2034  # MODEL_ARGS is read by the scripts that source this file
MODEL_ARGS=(
  --disable-bias-linear                # attention_bias false
  --qk-layernorm                       # Qwen3 q_norm / k_norm
  --group-query-attention
  --num-attention-heads 32             # num_attention_heads
  --num-query-groups 4                 # num_key_value_heads
  --kv-channels 128                    # head_dim
  --num-layers 48                      # num_hidden_layers
  --hidden-size 2048                   # hidden_size
  --ffn-hidden-size 6144               # intermediate_size (no dense layer uses it: every layer is MoE)
  --normalization RMSNorm
  --position-embedding-type rope
  --norm-epsilon 1e-6                  # rms_norm_eps
  --rotary-percent 1.0
  --swiglu                             # hidden_act silu, gated MLP
  --untie-embeddings-and-output-weights  # tie_word_embeddings false
  --vocab-size 151936                  # vocab_size
  --rotary-base 1000000                # rope_theta
  --moe-ffn-hidden-size 768            # moe_intermediate_size
  --moe-router-score-function softmax
  --moe-token-dispatcher-type alltoall
  --moe-router-topk 8                  # num_experts_per_tok
  --moe-layer-freq "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]"  # decoder_sparse_step 1: all 48 layers
  --num-experts 128                    # num_experts
  --moe-grouped-gemm
  --moe-token-drop-policy probs
  --moe-router-dtype fp32
  --moe-permute-fusion
  --moe-aux-loss-coeff 0               # slime's value: no load-balancing loss
)
