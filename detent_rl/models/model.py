"""The causal LM of the Llama / Qwen2 / Qwen3 families: one copy for the rollout engine and the trainer.

`forward(input_ids, positions)` maps the step's flat tokens [T] to final hidden states [T, hidden];
attention metadata and the KV caches come from the ForwardContext set around the call. `logits`
applies the LM head to whichever rows the caller wants (all of them for rescoring, each sequence's
last for sampling). Module and parameter names follow HF's, so the loader's mapping stays small.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from detent_rl.kernels.attention import pack_of
from detent_rl.kernels.programs.allreduce import AR_CONFIGS
from detent_rl.kernels.rotary import rope_cos_sin
from detent_rl.kernels.selections import Deployment, KernelSelections
from detent_rl.models.config import ModelConfig
from detent_rl.models.context import ForwardContext, KVCache, get_context, set_context
from detent_rl.models.layers import MLP, Attention, Device, Embedding, Linear, RMSNorm, RotaryEmbedding, local_heads
from detent_rl.models.parallel import TensorParallel, gather_columns


def deployment_for(config: ModelConfig, dtype: torch.dtype, *, page_size: int = 16, max_context: int = 4096,
                   max_batch: int = 256, max_num_tokens: int = 8192, tp_size: int = 1, **extra: int) -> Deployment:
    """The selection facts of serving `config` in `dtype` within the given limits (over `tp_size`
    tensor-parallel ranks; `extra`: other Deployment fields, e.g. the all-reduce workspaces)."""
    return Deployment(num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
                      head_dim=config.head_dim, hidden=config.hidden_size, vocab=config.vocab_size,
                      dtype_bytes=torch.empty((), dtype=dtype).element_size(), page_size=page_size,
                      max_context=max_context, max_batch=max_batch, max_num_tokens=max_num_tokens,
                      tp_size=tp_size, **extra)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, rotary: RotaryEmbedding, selections: KernelSelections,
                 device: Device, dtype: torch.dtype, tp: Optional[TensorParallel] = None) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Attention(config, layer_idx, rotary, selections, device, dtype, tp)
        self.mlp = MLP(hidden, config.intermediate_size, config.mlp_bias, selections, device, dtype, tp)
        self.input_layernorm = RMSNorm(hidden, eps, selections, device, dtype)
        self.post_attention_layernorm = RMSNorm(hidden, eps, selections, device, dtype)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: Optional[torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        (q, k, v), residual = self.head(positions, hidden, residual)
        return self.tail(self.self_attn.attend(q, k, v), residual)

    # `head` and `tail` are the layer's row-wise halves either side of attention (a row's outputs read only
    # that row): a step's graphed pieces (rollout/step_graphs.py) are one layer's tail and the next one's head.

    def head(self, positions: torch.Tensor, hidden: torch.Tensor, residual: Optional[torch.Tensor]
             ) -> tuple[tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor], torch.Tensor]:
        """The input norm and attention's `project`: ((q, k, v), residual)."""
        # The residual add is fused into the next norm; it rounds to the model dtype as HF's add does.
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        return self.self_attn.project(positions, hidden), residual

    def tail(self, attended: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """o_proj, the post-attention norm and the MLP: (hidden, residual)."""
        hidden, residual = self.post_attention_layernorm(self.self_attn.o_proj(attended), residual)
        return self.mlp(hidden), residual


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, selections: KernelSelections,
                 device: Device, dtype: torch.dtype, tp: Optional[TensorParallel] = None) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, selections, device, dtype, tp)
        self.layers = nn.ModuleList(DecoderLayer(config, i, rotary, selections, device, dtype, tp)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, selections, device, dtype)
        # with grad: keep each layer's inputs only and recompute the layer in the backward (the same
        # kernels, so the same bits); the trainer's `train.activation_checkpointing`
        self.checkpoint_layers = False

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        recompute = self.checkpoint_layers and torch.is_grad_enabled()
        ctx = get_context() if recompute else None
        for layer in self.layers:
            if recompute:  # the backward's recomputation runs outside the caller's `set_context`
                hidden, residual = checkpoint(_in_context, ctx, layer, positions, hidden, residual,
                                              use_reentrant=False)
            else:
                hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


def _in_context(ctx: ForwardContext, layer: nn.Module, *args: Any) -> Any:
    with set_context(ctx):
        return layer(*args)


class CausalLM(nn.Module):
    """The model; with `tp` (models/parallel.py) this rank's part of it, over `selections`' tp_size ranks."""

    def __init__(self, config: ModelConfig, selections: KernelSelections, device: Device = "cpu",
                 dtype: torch.dtype = torch.bfloat16, max_positions: Optional[int] = None,
                 tp: Optional[TensorParallel] = None) -> None:
        super().__init__()
        _check_deployment(config, selections.deployment, dtype)
        size = tp.size if tp is not None else 1
        if size > 1 and size not in AR_CONFIGS:
            raise ValueError(f"tensor parallelism over {size} ranks: the all-reduce's selection program has "
                             f"tables for {sorted(AR_CONFIGS)} ranks")
        if selections.deployment.tp_size != size:
            raise ValueError(f"the kernel selections were solved for {selections.deployment.tp_size} tensor-parallel "
                             f"ranks, the model is built for {size}")
        self.config, self.selections, self.dtype = config, selections, dtype
        self.tp = tp if size > 1 else None
        self.num_heads, self.num_kv_heads = local_heads(config, self.tp)
        self.device = torch.device(device)
        self.max_positions = max_positions or selections.deployment.max_context
        cos, sin = rope_cos_sin(config.hf_config, self.max_positions, device, dtype)
        width = self.num_heads * config.head_dim
        self.rotary = RotaryEmbedding(cos, sin, width, selections)
        self.model = DecoderModel(config, self.rotary, selections, device, dtype, self.tp)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, False, selections, device, dtype, self.tp,
                              "column" if self.tp is not None else None)
        if config.tie_word_embeddings:  # one tensor: a weight update reaches both uses
            self.lm_head.weight = self.model.embed_tokens.weight
        self._select_attention = selections.get("attention")
        # the engine's and the runner's logprobs ask for this one; asked here too, so that once the model
        # is built every site it has is known, and a tuple entry for any other site is refused
        selections.get("log_softmax")
        selections.check_commitment_used()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Final hidden states [T, hidden] of the step's tokens; needs `set_context` around it."""
        return self.model(input_ids, positions)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, hidden] -> [rows, vocab] in the model dtype (every rank's columns, gathered, under tp)."""
        out = self.lm_head(hidden)
        return out if self.tp is None else gather_columns(out, self.tp)

    def select_attention(self, num_seqs: int, max_seqlen_q: int, num_tokens: int, max_seqlen_k: int) -> Any:
        """The step's attention selection; `attention_tiling` of it is what `attn_meta` must tile the
        queries by."""
        return self._select_attention(num_seqs, max_seqlen_q, num_tokens, max_seqlen_k)

    def attention_tiling(self, selection: Any) -> tuple[int, int]:
        """(block_m, pack) of an attention selection: `attn_meta`'s last two arguments."""
        return selection.block_m, pack_of(selection, self.num_heads, self.num_kv_heads)

    @property
    def page_size(self) -> int:
        return self.selections.deployment.page_size

    def allocate_kv_cache(self, num_pages: int, page_size: Optional[int] = None,
                          memory: Optional[torch.Tensor] = None) -> list[KVCache]:
        """Zeroed (k_cache, v_cache) per layer, each [num_pages, page_size, kv_heads, head_dim] (this rank's
        KV heads under tp). `memory`: a uint8 tensor on the model's device of at least `kv_cache_bytes(num_pages)`
        to lay them out in (views of it, in layer order, each layer's k then v), in place of new allocations."""
        if page_size is not None and page_size != self.page_size:
            raise ValueError(f"page_size {page_size} differs from the deployment's {self.page_size}, "
                             f"which the attention selection was solved for")
        c = self.config
        shape = (num_pages, self.page_size, self.num_kv_heads, c.head_dim)
        if memory is None:
            return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                     torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(c.num_hidden_layers)]
        need = self.kv_cache_bytes(num_pages)
        elsewhere = memory.device.type != self.device.type or None not in (memory.device.index, self.device.index) \
            and memory.device.index != self.device.index
        if memory.dtype != torch.uint8 or memory.dim() != 1 or memory.numel() < need or elsewhere:
            raise ValueError(f"the KV cache's memory must be a flat uint8 tensor of at least {need} bytes on "
                             f"{self.device}; got {memory.dtype} {tuple(memory.shape)} on {memory.device}")
        every = memory[:need].view(self.dtype).view(c.num_hidden_layers, 2, *shape)
        every.zero_()
        return [(every[i, 0], every[i, 1]) for i in range(c.num_hidden_layers)]

    def kv_cache_bytes(self, num_pages: int) -> int:
        """The bytes `allocate_kv_cache(num_pages)` holds."""
        c = self.config
        return 2 * c.num_hidden_layers * num_pages * self.page_size * self.num_kv_heads * c.head_dim * \
            torch.empty(0, dtype=self.dtype).element_size()


def _check_deployment(config: ModelConfig, d: Deployment, dtype: torch.dtype) -> None:
    # The selectors were solved for these facts; another model's would select for the wrong shapes.
    want = deployment_for(config, dtype)
    wrong = [f"{k}: deployment {getattr(d, k)} vs model {getattr(want, k)}"
             for k in ("num_heads", "num_kv_heads", "head_dim", "hidden", "vocab", "dtype_bytes")
             if getattr(d, k) != getattr(want, k)]
    if wrong:
        raise ValueError(f"the kernel selections do not describe this model ({config.source}): {'; '.join(wrong)}")
