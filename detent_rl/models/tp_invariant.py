"""Commitment tuples under which a tensor-parallel model's bits equal one GPU's (`TensorParallel.invariant`).

A linear's bits are fixed by its K partition alone (kernels/matmul.py): K cut into chunks, each summed
from a fresh fp32 accumulator, the chunk sums added in chunk order, the bias, one rounding. So:

- a column-parallel linear (q/k/v, gate/up, the LM head) computes each of its output columns exactly
  as one GPU does if its site commits the same chunk as the one-GPU site of the same K;
- a row-parallel linear (o_proj, down_proj) cuts K over the ranks; if the one-GPU site commits
  chunk = K / tp_size and each rank's site one chunk (its whole K / tp_size), the ranks' unrounded
  fp32 partials are the one-GPU chunk sums, and the invariant mode adds them in rank order — the
  one-GPU fold — before the bias and the one rounding;
- every other site (attention, norms, log-softmax) runs per head or per row on the same data and
  takes the one-GPU site's pins; the embedding's and the logits' collectives are exact.

`tp_invariant_commitments` builds the pair: the one-GPU tuple (the detent defaults, row-parallel sites'
chunks set to K / tp_size) and the tp_size tuple that matches it. Each rank's K must be whole chunks of
the matmul program (multiples of 128): Qwen2-1.5B and Qwen3-0.6B qualify at TP = 2; Qwen2-0.5B's
o_proj (896 / 2 = 448) does not, and is refused.
"""
from __future__ import annotations

from dataclasses import asdict

import torch

from detent_rl.kernels.commitment import CommitmentTuple, SiteCommitment
from detent_rl.kernels.programs.matmul import CHUNK_ALIGN
from detent_rl.kernels.selections import KernelSelections, site_key
from detent_rl.models.config import ModelConfig
from detent_rl.models.model import CausalLM, deployment_for
from detent_rl.models.parallel import TensorParallel, is_sharded


def tp_invariant_commitments(config: ModelConfig, dtype: torch.dtype, tp_size: int,
                             **limits: int) -> tuple[CommitmentTuple, CommitmentTuple]:
    """(the one-GPU tuple, the tp_size tuple) under which `config`'s model gives the same bits on one GPU
    and, with `TensorParallel(..., invariant=True)`, over tp_size ranks. `limits`: deployment_for's."""
    one = KernelSelections(deployment_for(config, dtype, **limits), "detent")
    CausalLM(config, one, "meta", dtype)
    many = KernelSelections(deployment_for(config, dtype, tp_size=tp_size, **limits), "detent")
    CausalLM(config, many, "meta", dtype, tp=TensorParallel(0, tp_size))
    base, own = one.resolved().sites, many.resolved().sites
    rows = {(config.hidden_size, config.num_attention_heads * config.head_dim),
            (config.hidden_size, config.intermediate_size)}  # (n, k) of o_proj and down_proj on one GPU
    sites_one, sites_many = dict(base), {}

    def chunk_of(selections: KernelSelections, n: int, k: int) -> int:  # what the committed site runs
        return selections.get("matmul", n=n, k=k)(1).chunk

    def pinned(selections: KernelSelections, pins: dict, key: str, n: int, k: int, chunk: int) -> SiteCommitment:
        entry = selections.resolved().sites[key]
        if "chunk" in entry.pins:
            return SiteCommitment({**entry.pins, "chunk": chunk}, entry.knobs)
        if chunk_of(selections, n, k) != chunk:  # no pin: the site's one partition is fixed by its shape
            raise ValueError(f"{config.source}: matmul site {key} runs K in chunks of {chunk_of(selections, n, k)} "
                             f"whatever is committed; {chunk} is needed to match the other degree")
        return entry

    for key, (family, site) in many.sites().items():
        if family != "matmul":
            sites_many[key] = base.get(key, own[key])  # attention, norms, log-softmax: one GPU's pins
            continue
        n, k = site["n"], site["k"]
        if (n, k * tp_size) in rows:
            if k % CHUNK_ALIGN:
                raise ValueError(f"{config.source}: a row-parallel linear's K per rank, {k} (= {k * tp_size} / "
                                 f"{tp_size}), is not whole {CHUNK_ALIGN}-element chunks: no K partition is "
                                 f"shared by one GPU and {tp_size} ranks")
            whole = site_key("matmul", {"n": n, "k": k * tp_size})
            sites_one[whole] = pinned(one, base, whole, n, k * tp_size, k)
            sites_many[key] = pinned(many, own, key, n, k, k)
        elif site_key("matmul", {"n": n * tp_size, "k": k}) in base:
            sites_many[key] = pinned(many, own, key, n, k, chunk_of(one, n * tp_size, k))
        else:
            raise ValueError(f"matmul site {key} of the {tp_size}-rank model matches no one-GPU site")
    return (CommitmentTuple(sites_one, asdict(one.deployment)), CommitmentTuple(sites_many, asdict(many.deployment)))


class ShardLayout:
    """How a model's parameters are cut over `size` tensor-parallel ranks (read off a model built at that
    degree, on "meta" or not): `split` gives rank r's part of whole weights, `join` the whole weights of
    every rank's part — what moves weights between a trainer and engines of different degrees."""

    def __init__(self, model: CausalLM) -> None:
        if model.tp is None:
            raise ValueError("ShardLayout: the model is not cut over tensor-parallel ranks")
        self.size = model.tp.size
        self.specs: dict[str, tuple] = {}  # name -> () replicated | ("dim", d) | ("rows", ((start, rows), ...))
        for name, p in model.named_parameters():
            if not is_sharded(p):
                self.specs[name] = ()
            elif hasattr(p, "tp_rows"):
                self.specs[name] = ("rows", p.tp_rows)
            else:
                self.specs[name] = ("dim", p.tp_dim)

    def split(self, whole: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
        out = {}
        for name, spec in self.specs.items():
            t = whole[name]
            if not spec:
                out[name] = t
            elif spec[0] == "dim":
                n = t.shape[spec[1]] // self.size
                out[name] = t.narrow(spec[1], rank * n, n)
            else:  # each shard's whole rows (rows * size), this rank's block of them
                at, pieces = 0, []
                for _, rows in spec[1]:
                    pieces.append(t[at + rank * rows:at + (rank + 1) * rows])
                    at += rows * self.size
                out[name] = torch.cat(pieces)
        return out

    def join(self, parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if len(parts) != self.size:
            raise ValueError(f"ShardLayout.join: {len(parts)} parts for {self.size} ranks")
        out = {}
        for name, spec in self.specs.items():
            if not spec:
                out[name] = parts[0][name]
            elif spec[0] == "dim":
                out[name] = torch.cat([p[name] for p in parts], dim=spec[1])
            else:
                out[name] = torch.cat([p[name][start:start + rows] for start, rows in spec[1] for p in parts])
        return out
