"""SelIR transcriptions of SGLang 0.5.23's own kernel-selection code (for the SGLang patch).

Modules (each exposes its `@selection` program and a `REFERENCE_FACTS` deployment to solve it for):
  * `triton_decode`: Triton attention backend, decode `num_kv_splits` (`triton_decode_num_kv_splits`);
  * `fa3`: FlashAttention-3 num_splits / PackGQA / tile / per-request dynamic split (`fa3_num_splits`);
  * `moe_config`: fused-MoE Triton config, tuned-table row or default (`fused_moe_config`);
  * `custom_allreduce_v2`: custom all-reduce v2 algorithm for an all-reduce size (`custom_allreduce_v2`).

The plugin also supports SGLang 0.5.17 (the torch-2.11 stack): its Triton backend's split count equals
`triton_decode` there too (tests/test_sglang_plugin.py runs against either release), while its MoE tables
and all-reduce choice differ from `moe_config` and `custom_allreduce_v2`, so the plugin refuses those paths
on 0.5.17 (`rollout/sglang_plugin.py`, TRANSCRIBED_FOR).
"""
SGLANG_VERSION = "0.5.23"
