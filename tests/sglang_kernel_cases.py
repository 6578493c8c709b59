"""SGLang's own extend attention and fused-MoE Triton kernels on a batch, under each arm's selection, for
the benchmark (bench/sglang_kernels_bench.py --family extend / moe) and the CPU test that runs it
interpreted (tests/test_sglang_plugin.py).

Extend (SGLang 0.5.23, `sglang.kernels.ops.attention.extend_attention`): stock runs the two-stage
`extend_attention_fwd` (a row's cached prefix walked from the token pool, then the new chunk's keys);
SGLang's deterministic mode and the DETENT plugin (`pin_backend` sets the backend's deterministic flag)
run the one-stage `extend_attention_fwd_unified`, which walks prefix and chunk as one key sequence.
Neither reads the batch to choose tiles; what moves a row's bits is where the prefix ends.

Fused MoE (`invoke_fused_moe_kernel`, the up projection of Qwen3-30B-A3B-class experts): the config row
is SGLang's `try_get_optimal_moe_config` for the token count (stock), its deterministic mode's default
config, or the row the plugin's `pinned_moe_config` commits for every count. The expert alignment
(tokens sorted by expert, each expert's run padded to BLOCK_SIZE_M) is computed here in PyTorch:
SGLang's own is a compiled CUDA op.
"""
from __future__ import annotations

from itertools import accumulate
from types import SimpleNamespace

import torch

EXTEND_ARMS = ("stock", "unified")  # deterministic mode and the DETENT plugin both run the unified kernel
MOE_ARMS = ("stock", "deterministic", "detent")


class Prompts:
    """Prompts of given lengths, their keys and values scattered over one token pool (as SGLang's
    allocator leaves them), one query per token."""

    def __init__(self, lens: list[int], *, num_head: int, num_kv_head: int, dim: int, dtype: torch.dtype,
                 device: str, seed: int = 0) -> None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.lens, self.device, self.scale = lens, device, dim ** -0.5
        total = sum(lens)
        self.q = torch.randn(total, num_head, dim, generator=g).to(dtype).to(device)
        self.k = torch.randn(total, num_kv_head, dim, generator=g).to(dtype).to(device)  # by token
        self.v = torch.randn(total, num_kv_head, dim, generator=g).to(dtype).to(device)
        self.slot = torch.randperm(total, generator=g).to(device)  # token t's key at pool row slot[t]
        self.pool_k, self.pool_v = torch.empty_like(self.k), torch.empty_like(self.v)
        self.pool_k[self.slot], self.pool_v[self.slot] = self.k, self.v
        self.start = [0] + list(accumulate(lens))

    def extend(self, arm: str, chunks: list[tuple[int, int, int]]):
        """A thunk running one extend step of `chunks` — (prompt, cached prefix, new tokens) each — and
        its output rows [sum of new tokens, heads, dim]."""
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd, extend_attention_fwd_unified
        i32 = dict(dtype=torch.int32, device=self.device)
        rows = torch.cat([torch.arange(self.start[p] + pre, self.start[p] + pre + n, device=self.device)
                          for p, pre, n in chunks])
        q = self.q[rows].contiguous()
        o = torch.empty_like(q)
        qo = torch.tensor([0] + list(accumulate(n for _, _, n in chunks)), **i32)
        longest = max(n for _, _, n in chunks)
        if arm == "unified":
            kv = torch.cat([self.slot[self.start[p]:self.start[p] + pre + n] for p, pre, n in chunks]).to(torch.int32)
            kv_ptr = torch.tensor([0] + list(accumulate(pre + n for _, pre, n in chunks)), **i32)
            pre = torch.tensor([pre for _, pre, _ in chunks], **i32)

            def run() -> None:
                extend_attention_fwd_unified(q, o, self.pool_k, self.pool_v, 1.0, 1.0, qo, kv_ptr, kv, pre, longest,
                                             sm_scale=self.scale, is_causal=True)
        elif arm == "stock":
            k, v = self.k[rows].contiguous(), self.v[rows].contiguous()
            kv = torch.cat([self.slot[self.start[p]:self.start[p] + pre] for p, pre, _ in chunks]).to(torch.int32)
            kv_ptr = torch.tensor([0] + list(accumulate(pre for _, pre, _ in chunks)), **i32)

            def run() -> None:
                extend_attention_fwd(q, k, v, o, self.pool_k, self.pool_v, qo, kv_ptr, kv, None, True, None, longest,
                                     1.0, 1.0, sm_scale=self.scale)
        else:
            raise ValueError(f"unknown extend arm {arm!r}; expected one of {EXTEND_ARMS}")
        return run, o

    def rows(self, arm: str, prompt: int, chunks: list[tuple[int, int, int]]) -> torch.Tensor:
        """Prompt `prompt`'s output rows when its tokens come in `chunks` (steps of (prompt, prefix,
        new tokens) lists, each step run in turn)."""
        out = []
        for step in chunks:
            run, o = self.extend(arm, step)
            run()
            at = 0
            for p, _, n in step:
                if p == prompt:
                    out.append(o[at:at + n])
                at += n
        return torch.cat(out)


def moe_config(arm: str, w1_shape: tuple, w2_shape: tuple, top_k: int, m: int) -> dict:
    """The up projection's config SGLang runs for `m` tokens under `arm` (in a process where the plugin's
    hooks are not applied: its AROUND hook is called here by hand)."""
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as F

    from detent_rl.rollout import sglang_plugin as P
    if arm not in MOE_ARMS:
        raise ValueError(f"unknown MoE arm {arm!r}; expected one of {MOE_ARMS}")
    original = F.try_get_optimal_moe_config
    # SGLang's execution context (a server publishes it) with the arm's deterministic-inference flag
    flag = SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=arm == "deterministic"))
    exec_ctx, F.get_exec = F.get_exec, lambda: flag
    F.get_moe_configs.cache_clear()
    try:
        if arm == "detent":
            config = P.pinned_moe_config(original, w1_shape, w2_shape, top_k, None, m)
        else:
            config = original(w1_shape, w2_shape, top_k, None, m)
    finally:
        F.get_exec = exec_ctx
        F.get_moe_configs.cache_clear()
    return {k: v for k, v in config.items() if k != "USE_TMA"}


def align(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's expert alignment: (sorted_token_ids — flat (token, k) indices grouped by expert, each
    group padded to a multiple of `block_m` with `topk_ids.numel()` —, the expert of each block, the
    padded count)."""
    flat = topk_ids.flatten()
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    order = torch.argsort(flat, stable=True)
    ids, experts, at = [], [], 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        padded = -(-n // block_m) * block_m
        run = torch.full((padded,), flat.numel(), dtype=torch.int32, device=flat.device)
        run[:n] = order[at:at + n].to(torch.int32)
        ids.append(run)
        experts += [e] * (padded // block_m)
        at += n
    sorted_ids = torch.cat(ids)
    return (sorted_ids, torch.tensor(experts, dtype=torch.int32, device=flat.device),
            torch.tensor([sorted_ids.numel()], dtype=torch.int32, device=flat.device))


def moe_up(x: torch.Tensor, w1: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, config: dict):
    """A thunk running SGLang's fused-MoE kernel for the up projection of tokens `x` under `config`, and
    its output [tokens, top_k, 2 * intermediate]."""
    import triton.language as tl
    from sglang.kernels.ops.moe.fused_moe_triton_kernels import invoke_fused_moe_kernel
    top_k = topk_ids.shape[1]
    out = torch.empty(x.shape[0], top_k, w1.shape[1], dtype=x.dtype, device=x.device)
    sorted_ids, experts, padded = align(topk_ids, config["BLOCK_SIZE_M"], w1.shape[0])
    compute = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[x.dtype]

    def run() -> None:
        invoke_fused_moe_kernel(x, w1, None, out, None, None, None, topk_weights, topk_ids, sorted_ids, experts,
                                padded, False, top_k, config, compute_type=compute, use_fp8_w8a8=False,
                                use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False,
                                per_channel_quant=False)
    return run, out
