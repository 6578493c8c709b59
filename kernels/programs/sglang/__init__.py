"""SelIR transcriptions of SGLang 0.5.23's own kernel-selection code (for the SGLang patch).

Modules (each exposes its `@selection` program and a `REFERENCE_FACTS` deployment to solve it for):
  * `triton_decode`: Triton attention backend, decode `num_kv_splits` (`triton_decode_num_kv_splits`);
  * `fa3`: FlashAttention-3 num_splits / PackGQA / tile / per-request dynamic split (`fa3_num_splits`);
  * `moe_config`: fused-MoE Triton config, tuned-table row or default (`fused_moe_config`);
  * `custom_allreduce_v2`: custom all-reduce v2 algorithm for an all-reduce size (`custom_allreduce_v2`).
"""
SGLANG_VERSION = "0.5.23"
