"""Tuned fused-MoE configuration tables (token count -> Triton config), as SGLang 0.5.23 ships them.

Source: sglang 0.5.23, srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0/
`E=128,N=768,device_name=NVIDIA_H200.json` (Qwen3-30B-A3B at TP 1, bf16), 18 rows.
"""
from __future__ import annotations

from detent_rl.selir import record


@record
class MoeConfig:
    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int
    num_warps: int
    num_stages: int


def _row(m: int, n: int, k: int, g: int, w: int, s: int) -> MoeConfig:
    return MoeConfig(BLOCK_SIZE_M=m, BLOCK_SIZE_N=n, BLOCK_SIZE_K=k, GROUP_SIZE_M=g, num_warps=w, num_stages=s)


H200_E128_N768 = {
    1: _row(16, 64, 64, 1, 4, 5), 2: _row(16, 64, 64, 1, 4, 4), 4: _row(16, 64, 128, 16, 4, 2),
    8: _row(16, 64, 128, 1, 4, 3), 16: _row(16, 64, 256, 1, 4, 2), 24: _row(16, 64, 128, 1, 4, 4),
    32: _row(16, 64, 128, 16, 4, 2), 48: _row(16, 128, 128, 16, 4, 3), 64: _row(16, 256, 128, 1, 8, 2),
    96: _row(16, 128, 128, 1, 4, 2), 128: _row(16, 128, 128, 1, 4, 2), 256: _row(32, 256, 128, 16, 4, 2),
    512: _row(64, 128, 64, 1, 4, 3), 1024: _row(128, 256, 64, 16, 8, 4), 1536: _row(128, 256, 64, 1, 8, 4),
    2048: _row(128, 256, 64, 1, 8, 4), 3072: _row(128, 256, 64, 1, 8, 4), 4096: _row(128, 256, 64, 16, 8, 4),
}
