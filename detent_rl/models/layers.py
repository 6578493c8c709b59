"""The model's layers, each a thin shell over one of our kernels and the selector of its call site.

Kernels are called through `kernels.autograd`, which is the kernel call itself unless a
parameter or input needs a gradient (the trainer), and then the same call with a backward.
Every layer asks `KernelSelections` for its selector once, at construction (selectors are memoised
per site, so the 2 x num_layers norms of one width share one), and calls it with the step's row
count on every forward. A row's bits are decided by the selected kernel parameters only, which is
what makes them batch-invariant under the pinned arms. One exception, by design: the stock arm's
linears are `torch.nn.functional.linear` (cuBLAS on the GPU) — the GEMM a stock engine runs and
every speed ratio is taken against (`kernels.matmul.stock_linear`); its other layers are our
kernels under the stock selection.

Each parameter carries its own `weight_loader(param, tensor[, shard_id])`; fused projections
(q/k/v, gate/up) load their HF shards into row ranges of one weight, so one matmul serves them.
With tensor parallelism (`tp`, models/parallel.py) the projections are column- or row-parallel and
each loader narrows a whole checkpoint tensor to its rank's part.
"""
from __future__ import annotations

import torch
from torch import nn

from detent_rl.kernels.attention import pack_of
from detent_rl.kernels.autograd import (attention_autograd, embedding_autograd, linear_autograd,
                                       rmsnorm_autograd, rotary_autograd, rotary_store_autograd,
                                       silu_and_mul_autograd)
from detent_rl.kernels import matmul_gated
from detent_rl.kernels.matmul import launch_params, stock_linear
from detent_rl.kernels.selections import KernelSelections
from detent_rl.models.config import ModelConfig
from detent_rl.models.context import get_context
from detent_rl.models.parallel import TensorParallel, copy_to_ranks, narrow_to_rank, reduce_from_ranks, shard

Device = torch.device | str


def new_param(shape: tuple[int, ...], device: Device, dtype: torch.dtype) -> nn.Parameter:
    # No grad by default (the rollout's case); the trainer turns it on with `requires_grad_()`.
    p = nn.Parameter(torch.empty(shape, device=device, dtype=dtype), requires_grad=False)
    p.weight_loader = copy_weight
    return p


def copy_weight(param: nn.Parameter, loaded: torch.Tensor) -> None:
    _copy_into(param.data, loaded)


def _copy_into(dst: torch.Tensor, loaded: torch.Tensor) -> None:
    if dst.shape != loaded.shape:
        raise ValueError(f"shape {tuple(loaded.shape)} does not fit the parameter's {tuple(dst.shape)}")
    dst.copy_(loaded)


class Linear(nn.Module):
    """y = x @ weight.T (+ bias), weight [out, in], through the matmul selector of (n=out, k=in).

    With `tp` and `parallel` "column": this rank's out/size output rows (input whole, gradient summed over
    the ranks); "row": its in/size input columns, the partial outputs summed over the ranks, then the
    (whole) bias added."""

    def __init__(self, in_features: int, out_features: int, bias: bool, selections: KernelSelections,
                 device: Device, dtype: torch.dtype, tp: TensorParallel | None = None,
                 parallel: str | None = None) -> None:
        super().__init__()
        if (tp is None) != (parallel is None) or parallel not in (None, "column", "row"):
            raise ValueError(f"parallel {parallel!r} with tp {tp}: give both (column or row) or neither")
        self.tp, self.parallel = tp, parallel
        if parallel == "column":
            out_features = tp.part(out_features, "output features")
        elif parallel == "row":
            in_features = tp.part(in_features, "input features")
        self.weight = new_param((out_features, in_features), device, dtype)
        self.bias = new_param((out_features,), device, dtype) if bias else None
        if tp is not None:
            shard(self.weight, tp, 0 if parallel == "column" else 1)
            if self.bias is not None and parallel == "column":
                shard(self.bias, tp, 0)
            self._reduce = selections.get("allreduce")
        self._select = selections.get("matmul", n=out_features, k=in_features)
        self._stock = not selections.pinned
        if parallel == "row" and tp.invariant:
            if self._stock:
                raise ValueError("TP-invariant row-parallel sums need the pinned linear (the stock arm's is cuBLAS)")
            chunk = self._select(1).chunk  # pinned: the same for every M
            if chunk < in_features:
                raise ValueError(f"TP-invariant mode: the row-parallel linear (n={out_features}, k={in_features} per "
                                 f"rank) is cut into chunks of {chunk}; each rank's K must be one chunk (pin it, "
                                 f"tp_invariant_commitments)")

    def _linear(self, x: torch.Tensor, bias: torch.Tensor | None, **extra) -> torch.Tensor:
        if self._stock:  # the stock arm: what a stock engine runs (cuBLAS picks its algorithm by shape)
            return stock_linear(x, self.weight, bias)
        launch = launch_params(self._select(x.shape[0]))
        return linear_autograd(x, self.weight, bias, {**launch, **extra} if extra else launch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel is None:
            return self._linear(x, self.bias)
        if self.parallel == "column":
            return self._linear(copy_to_ranks(x, self.tp, self._reduce), self.bias)
        if self.tp.invariant:  # the one-GPU chunk fold: fp32 partials in rank order, bias, one rounding
            y = reduce_from_ranks(self._linear(x, None, out_dtype=torch.float32), self.tp, None)
            return (y if self.bias is None else y + self.bias.float()).to(x.dtype)
        y = reduce_from_ranks(self._linear(x, None), self.tp, self._reduce)
        return y if self.bias is None else y + self.bias


class MergedLinear(Linear):
    """Several projections of one input stacked along the output: shards (name, rows) in order."""

    def __init__(self, in_features: int, shards: dict[str, int], bias: bool, selections: KernelSelections,
                 device: Device, dtype: torch.dtype, tp: TensorParallel | None = None) -> None:
        # column-parallel under tp: this rank's part of every shard, the parts in shard order
        super().__init__(in_features, sum(shards.values()), bias, selections, device, dtype, tp,
                         "column" if tp is not None else None)
        if tp is not None:
            shards = {name: tp.part(rows, f"{name} rows") for name, rows in shards.items()}
        self.offsets, at = {}, 0
        for name, rows in shards.items():
            self.offsets[name] = (at, rows)
            at += rows
        for p in (self.weight, self.bias):
            if p is not None:
                p.weight_loader = self.load_shard
                p.shard_ids = tuple(shards)
                if tp is not None:  # this rank's rows of each shard, in shard order (models/tp_invariant.py)
                    p.tp_rows = tuple(self.offsets.values())

    def load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:
        start, rows = self.offsets[shard_id]
        dst = param.data.narrow(0, start, rows)
        if self.tp is not None:  # a whole checkpoint shard: this rank's rows of it
            loaded = narrow_to_rank(self.tp, 0, dst.shape, loaded)
        _copy_into(dst, loaded)


class RMSNorm(nn.Module):
    """HF RMSNorm over the last dim of [rows, width]; with `residual`, fused add, returns (out, sum)."""

    def __init__(self, width: int, eps: float, selections: KernelSelections, device: Device,
                 dtype: torch.dtype, rows_per_token: int = 1) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param((width,), device, dtype)
        # a per-head norm (Qwen3's q/k norm) has `heads` rows per token: its site's row bound says so
        site = {"rows_per_token": rows_per_token} if rows_per_token != 1 else {}
        self._select = selections.get("rmsnorm", hidden=width, **site)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        s = self._select(x.shape[0])
        return rmsnorm_autograd(x, self.weight, self.eps, block=s.block, num_warps=s.num_warps, residual=residual)


class Embedding(nn.Module):
    """weight[ids]; under `tp` vocabulary-parallel: this rank's vocab/size rows, ids outside them give
    zero rows, and the ranks' rows are summed (one value plus zeros: exact)."""

    def __init__(self, vocab: int, hidden: int, selections: KernelSelections, device: Device,
                 dtype: torch.dtype, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.tp = tp
        if tp is not None:
            vocab = tp.part(vocab, "vocabulary")
            self._reduce = selections.get("allreduce")
        self.weight = new_param((vocab, hidden), device, dtype)
        if tp is not None:
            shard(self.weight, tp, 0)
        self._select = selections.get("elementwise", width=hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        block = self._select(ids.shape[0]).block
        if self.tp is None:
            return embedding_autograd(ids, self.weight, block=block)
        start, rows = self.tp.rank * self.weight.shape[0], self.weight.shape[0]
        outside = (ids < start) | (ids >= start + rows)
        local = torch.where(outside, torch.zeros_like(ids), ids - start)
        out = embedding_autograd(local, self.weight, block=block).masked_fill(outside.unsqueeze(-1), 0)
        return reduce_from_ranks(out, self.tp, self._reduce)


class RotaryEmbedding(nn.Module):
    """One cos/sin table by absolute position, shared by every layer (and by rollout and trainer)."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, width: int, selections: KernelSelections) -> None:
        super().__init__()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self._select = selections.get("elementwise", width=width)  # width: q heads x head_dim

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rotated (q, k); k is None when the same launch stored k and v into the caches (no gradient)."""
        return rotary_store_autograd(q, k, v, positions, self.cos, self.sin, k_cache, v_cache, slots,
                                     block=self._select(q.shape[0]).block)

    def rotate(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated (q, k), nothing stored (the same rotation as `forward`'s)."""
        return rotary_autograd(q, k, positions, self.cos, self.sin, block=self._select(q.shape[0]).block)


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up fused into one matmul; without a gradient, with
    `DETENT_GATED_MLP=1`, SiLU-and-mul runs in that matmul's epilogue (`kernels/matmul_gated.py`: the same bits)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool, selections: KernelSelections,
                 device: Device, dtype: torch.dtype, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden, {"gate": intermediate, "up": intermediate}, bias,
                                         selections, device, dtype, tp)
        self.down_proj = Linear(intermediate, hidden, bias, selections, device, dtype, tp,
                                "row" if tp is not None else None)
        width = tp.part(intermediate, "intermediate_size") if tp is not None else intermediate
        self._select = selections.get("elementwise", width=width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, block = self.gate_up_proj, self._select(x.shape[0]).block
        if (not gate_up._stock and matmul_gated.enabled()
                and not (torch.is_grad_enabled() and (x.requires_grad or gate_up.weight.requires_grad))):
            # SiLU-and-mul in the projection's epilogue where the schedule is `fusable`, else the two kernels
            launch = launch_params(gate_up._select(x.shape[0]))
            return self.down_proj(matmul_gated.gate_up_silu(x, gate_up.weight, gate_up.bias, block=block, **launch))
        return self.down_proj(silu_and_mul_autograd(gate_up(x), block=block))


def local_heads(config: ModelConfig, tp: TensorParallel | None) -> tuple[int, int]:
    """(query heads, KV heads) of one rank; each KV head's query group stays on its rank."""
    if tp is None:
        return config.num_attention_heads, config.num_key_value_heads
    return (tp.part(config.num_attention_heads, "num_attention_heads"),
            tp.part(config.num_key_value_heads, "num_key_value_heads (KV heads are not replicated)"))


class Attention(nn.Module):
    """Fused q/k/v projection, optional per-head q/k RMSNorm (Qwen3), rotary at absolute positions,
    the step's keys stored into this layer's paged cache, paged causal attention, o_proj."""

    def __init__(self, config: ModelConfig, layer_idx: int, rotary: RotaryEmbedding, selections: KernelSelections,
                 device: Device, dtype: torch.dtype, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = d = config.head_dim
        q_size, kv_size = config.num_attention_heads * d, config.num_key_value_heads * d
        self.qkv_proj = MergedLinear(config.hidden_size, {"q": q_size, "k": kv_size, "v": kv_size},
                                     config.attention_bias, selections, device, dtype, tp)
        self.o_proj = Linear(q_size, config.hidden_size, config.o_proj_bias, selections, device, dtype, tp,
                             "row" if tp is not None else None)
        self.num_heads, self.num_kv_heads = local_heads(config, tp)  # this rank's heads
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        self.scale = d ** -0.5
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps, selections, device, dtype, self.num_heads)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, selections, device, dtype, self.num_kv_heads)
        self.rotary = rotary
        self._select = selections.get("attention")
        # The stock arm needs no tile-neutral row sum, so it runs the faster one for its tile: `tl.sum` in 128-key
        # tiles (its 16 x 128 decode tile: 20.0 against 22.3 µs at batch 256, 44.6 against 52.4 at 2 x 12,000),
        # the dot in 64-key ones (its 64 x 64 prefill tile: equal or faster everywhere measured;
        # docs/BENCHMARKS.md, session 27). A stock engine's attention (FlashAttention's) sums in a tree too.
        self._stock = not selections.pinned

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.attend(*self.project(positions, x)))

    def project(self, positions: torch.Tensor, x: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The row-wise half before attention: q/k/v projected (and q/k normed), rotated at their positions;
        the step's keys stored into this layer's cache at the context's slots, when no gradient needs k
        (then k comes back None). (q, k, v), each [tokens, heads, head_dim]."""
        ctx = get_context()
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(tokens, self.num_heads, self.head_dim)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(tokens, self.num_kv_heads, self.head_dim)
        if ctx.sglang is not None:  # the trainer's side of an SGLang rollout: nothing stored (SGLang's kernels)
            q, k = self.rotary.rotate(positions, q, k)
            return q, k, v
        k_cache, v_cache = ctx.kv_caches[self.layer_idx]
        q, k = self.rotary(positions, q, k, v, k_cache, v_cache, ctx.slots)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor, out: torch.Tensor | None = None
               ) -> torch.Tensor:
        """Paged causal attention of `project`'s rows over the context's caches and metadata: [tokens,
        q_size]. `out`: a [tokens, heads, head_dim] tensor to write it into (no gradient)."""
        ctx = get_context()
        tokens = q.shape[0]
        if ctx.sglang is not None:  # SGLang's attention kernels give each row the bits the rollout gave it
            from detent_rl.rollout.sglang_attention import sglang_attention_autograd
            return sglang_attention_autograd(q, k, v, ctx.sglang, self.scale).reshape(tokens, self.q_size)
        k_cache, v_cache = ctx.kv_caches[self.layer_idx]
        s = self._select(ctx.num_seqs, ctx.max_seqlen_q, tokens, ctx.max_seqlen_k)
        tiling = (s.block_m, pack_of(s, self.num_heads, self.num_kv_heads))
        if tiling != (ctx.meta.block_m, ctx.meta.pack):
            raise RuntimeError(f"the step's AttnMeta was built with (block_m, pack)="
                               f"{(ctx.meta.block_m, ctx.meta.pack)} but the attention selection gives {tiling}; "
                               f"build it with CausalLM.select_attention and attention_tiling")
        out = attention_autograd(q, k, v, k_cache, v_cache, ctx.slots, ctx.meta, scale=self.scale,
                                 block_n=s.block_n, split_size=s.split_size, num_splits=s.num_splits,
                                 num_warps=s.num_warps, num_stages=s.num_stages, prefetch=s.kv_prefetch,
                                 tree_sum=self._stock and s.block_n == 128, fixed_split=not self._stock, out=out)
        return out.reshape(tokens, self.q_size)
