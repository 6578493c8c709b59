"""SGLang 0.5.23, fused-MoE Triton kernel config: tuned-table look-up or default (SelIR transcription).

Transcribes, from the `sglang==0.5.23` wheel, `srt/layers/moe/moe_runner/triton_utils/`:
  * `fused_moe_triton_config.py`: `get_moe_configs` (54-177: deterministic => None, exact Triton
    version folder, else the newest folder holding the file, `_down` falling back to the up table),
    `get_default_config` (180-261) and `try_get_optimal_moe_config` (264-340: nearest tuned row,
    first key on ties; the down row takes the up row's BLOCK_SIZE_M);
  * `fused_moe.py` `_prepare_fused_moe_run` (~442-510): `USE_TMA` is honoured only where
    `support_tensor_descriptor()`; with no down table the down GEMM runs the up config, no TMA.

Tables transcribed (JSON order kept, it decides ties): E=128, N=768, bf16 (dtype None) from
`configs/triton_3_6_0/..NVIDIA_H200.json` (= triton_3_2_0's), `configs/triton_3_7_1/
..NVIDIA_H100_80GB_HBM3.json` and its `_down.json` (identical rows), and `configs/triton_3_2_0/
..NVIDIA_H100_80GB_HBM3.json` (same rows, no USE_TMA). `tuned_config_shipped` says whether SGLang
ships a file for the deployment's (device, E, N, dtype, block shape); a shipped file that is not
transcribed here is refused at specialization. `num_warps` / `num_stages` 0 means the key is absent
(Triton's launch defaults apply). The `override_config()` context (tuning scripts) is not modelled.
"""
from __future__ import annotations

from detent_rl.selir import Fact, Unpinnable, assume, nearest_key, record, require, selection


@record
class MoEConfig:
    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int
    num_warps: int  # 0: absent from the config dict
    num_stages: int  # 0: absent from the config dict
    USE_TMA: bool


def _table(rows: tuple, tma_at: int = 0) -> dict:
    """{M: MoEConfig} from (M, BLOCK_SIZE_M, N, K, GROUP_SIZE_M, num_warps, num_stages) rows."""
    return {r[0]: MoEConfig(BLOCK_SIZE_M=r[1], BLOCK_SIZE_N=r[2], BLOCK_SIZE_K=r[3], GROUP_SIZE_M=r[4],
                            num_warps=r[5], num_stages=r[6], USE_TMA=r[0] == tma_at) for r in rows}


_H200_ROWS = (
    (1, 16, 64, 64, 1, 4, 5), (2, 16, 64, 64, 1, 4, 4), (4, 16, 64, 128, 16, 4, 2),
    (8, 16, 64, 128, 1, 4, 3), (16, 16, 64, 256, 1, 4, 2), (24, 16, 64, 128, 1, 4, 4),
    (32, 16, 64, 128, 16, 4, 2), (48, 16, 128, 128, 16, 4, 3), (64, 16, 256, 128, 1, 8, 2),
    (96, 16, 128, 128, 1, 4, 2), (128, 16, 128, 128, 1, 4, 2), (256, 32, 256, 128, 16, 4, 2),
    (512, 64, 128, 64, 1, 4, 3), (1024, 128, 256, 64, 16, 8, 4), (1536, 128, 256, 64, 1, 8, 4),
    (2048, 128, 256, 64, 1, 8, 4), (3072, 128, 256, 64, 1, 8, 4), (4096, 128, 256, 64, 16, 8, 4),
)
_H100_ROWS = (
    (1, 16, 64, 128, 1, 4, 3), (2, 16, 64, 64, 1, 4, 3), (4, 16, 64, 64, 64, 4, 5),
    (8, 16, 128, 128, 1, 8, 5), (16, 16, 128, 128, 1, 8, 5), (24, 16, 64, 256, 16, 4, 3),
    (32, 16, 128, 256, 1, 8, 3), (48, 16, 128, 256, 1, 8, 3), (64, 16, 256, 128, 1, 8, 3),
    (96, 16, 128, 128, 1, 4, 2), (128, 16, 128, 128, 16, 4, 2), (256, 32, 256, 128, 1, 4, 2),
    (512, 64, 128, 128, 1, 4, 2), (1024, 64, 128, 64, 1, 4, 3), (1536, 128, 256, 64, 1, 8, 4),
    (2048, 128, 256, 64, 1, 8, 4), (3072, 128, 256, 64, 1, 8, 4), (4096, 128, 256, 64, 1, 8, 4),
)
H200_E128_N768 = _table(_H200_ROWS)  # triton_3_6_0 and triton_3_2_0
H100_E128_N768_T371 = _table(_H100_ROWS, tma_at=4096)  # triton_3_7_1, also its _down.json
H100_E128_N768_T320 = _table(_H100_ROWS)  # triton_3_2_0 (no USE_TMA key)

# (device_name, E, N, dtype, block_n, block_k, per_channel_quant, down_moe) -> {triton version: table},
# versions newest first: the order get_moe_configs falls back in.
CONFIG_FILES = {
    ("NVIDIA_H200", 128, 768, "", 0, 0, False, False): {"3.6.0": H200_E128_N768, "3.2.0": H200_E128_N768},
    ("NVIDIA_H100_80GB_HBM3", 128, 768, "", 0, 0, False, False): {"3.7.1": H100_E128_N768_T371,
                                                                  "3.2.0": H100_E128_N768_T320},
    ("NVIDIA_H100_80GB_HBM3", 128, 768, "", 0, 0, False, True): {"3.7.1": H100_E128_N768_T371},
}
NO_TABLE = {}


@selection
def shipped_table(key: Fact[tuple], triton_version: Fact[str]):
    """The table get_moe_configs loads for one file name: exact version folder, else the newest."""
    if key not in CONFIG_FILES:
        return NO_TABLE
    versions = CONFIG_FILES[key]
    if triton_version in versions:
        return versions[triton_version]
    chosen = NO_TABLE
    for v in versions:
        if len(chosen) == 0:
            chosen = versions[v]
    return chosen


@selection
def get_default_config(M: Unpinnable[int], E: Fact[int], dtype: Fact[str], is_marlin: Fact[bool],
                       block_n: Fact[int], block_k: Fact[int], deterministic: Fact[bool],
                       low_smem_fp8: Fact[bool], is_hip: Fact[bool]):
    if deterministic:
        return MoEConfig(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=8, num_warps=0,
                         num_stages=0, USE_TMA=False)
    if dtype == "fp8_w8a8":
        if block_n == 0:
            if low_smem_fp8:  # shared_memory_per_block_optin < 128 KiB (CUDA only)
                if M > E:
                    return MoEConfig(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=256, GROUP_SIZE_M=64,
                                     num_warps=4, num_stages=2, USE_TMA=False)
                return MoEConfig(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=256, GROUP_SIZE_M=1,
                                 num_warps=4, num_stages=4, USE_TMA=False)
            if M <= E:
                return MoEConfig(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                                 num_warps=4, num_stages=2 if is_hip else 4, USE_TMA=False)
            return MoEConfig(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=32,
                             num_warps=8, num_stages=2 if is_hip else 4, USE_TMA=False)
        # block-wise fp8: BLOCK_SIZE_K must be a multiple of block_shape[1]
        return MoEConfig(BLOCK_SIZE_M=64, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k, GROUP_SIZE_M=32,
                         num_warps=4, num_stages=2 if is_hip else 3, USE_TMA=False)
    small_m = M <= E or (is_marlin and M <= 32)  # "fused marlin works faster with this config for small M"
    if small_m:
        return MoEConfig(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=0,
                         num_stages=0, USE_TMA=False)
    return MoEConfig(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=8, num_warps=0,
                     num_stages=0, USE_TMA=False)


@selection
def fused_moe_config(M: Unpinnable[int], device_name: Fact[str], E: Fact[int], N: Fact[int], dtype: Fact[str],
                     block_n: Fact[int], block_k: Fact[int], per_channel_quant: Fact[bool], is_marlin: Fact[bool],
                     triton_version: Fact[str], tuned_config_shipped: Fact[bool], deterministic: Fact[bool],
                     low_smem_fp8: Fact[bool], is_hip: Fact[bool], support_tma: Fact[bool],
                     max_num_tokens: Fact[int]):
    """M: tokens on this rank (hidden_states.shape[0]); the kernel itself needs the real count."""
    assume(1 <= M <= max_num_tokens)
    up_key = (device_name, E, N, dtype, block_n, block_k, per_channel_quant, False)
    down_key = (device_name, E, N, dtype, block_n, block_k, per_channel_quant, True)
    require((up_key in CONFIG_FILES) == tuned_config_shipped,
            "SGLang ships a tuned MoE config for this deployment that is not transcribed here")
    up_table = NO_TABLE if deterministic else shipped_table(up_key, triton_version)
    down_table = NO_TABLE if deterministic else shipped_table(down_key, triton_version)
    if len(down_table) == 0:
        down_table = up_table  # no _down file: reuse the tuned up-projection table
    if len(up_table) > 0:
        table_key = nearest_key(up_table, M)
        config = up_table[table_key]
        source = "tuned"
    else:
        config = get_default_config(M, E, dtype, is_marlin, block_n, block_k, deterministic, low_smem_fp8, is_hip)
        source = "default"
    down = config  # down_config None: the down GEMM runs `down_config or config`, without TMA
    down_tma = False
    if len(down_table) > 0:
        row = down_table[nearest_key(down_table, M)]
        # one moe_align_block_size sort serves both GEMMs, so the down row takes the up BLOCK_SIZE_M
        down = MoEConfig(BLOCK_SIZE_M=config.BLOCK_SIZE_M, BLOCK_SIZE_N=row.BLOCK_SIZE_N,
                         BLOCK_SIZE_K=row.BLOCK_SIZE_K, GROUP_SIZE_M=row.GROUP_SIZE_M, num_warps=row.num_warps,
                         num_stages=row.num_stages, USE_TMA=row.USE_TMA)
        down_tma = support_tma and row.USE_TMA
    return {"up": config, "down": down, "up_use_tma": support_tma and config.USE_TMA, "down_use_tma": down_tma,
            "source": source}


# Qwen3-30B-A3B (128 experts, moe_intermediate_size 768, bf16) at TP1 on an H200 with Triton 3.6.0
# (the exact-version folder holding the H200 table), chunked prefill up to 8192 tokens.
REFERENCE_FACTS = {
    "device_name": "NVIDIA_H200", "E": 128, "N": 768, "dtype": "", "block_n": 0, "block_k": 0,
    "per_channel_quant": False, "is_marlin": False, "triton_version": "3.6.0", "tuned_config_shipped": True,
    "deterministic": False, "low_smem_fp8": False, "is_hip": False, "support_tma": True,
    "max_num_tokens": 8192,
}

PROGRAM = fused_moe_config  # the module's main program (for the registry and reports)
