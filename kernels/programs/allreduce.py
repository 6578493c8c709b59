"""Selection program of our tensor-parallel all-reduce family.

Stock selection picks the algorithm from the message size, the world size and whether a CUDA
graph is being captured, with thresholds in the style of SGLang's custom all-reduce v2 tables:
one-shot push for small messages, two-shot push, then two-shot pull, then NCCL. Each algorithm
adds a row's values across ranks in a different order, so a message that grows with the batch
changes the bits. Our kernels (`kernels/allreduce.py`) sum each element in an order fixed by the
algorithm: one-shot in rank order, two-shot starting at the rank that owns the element's chunk (as
custom all-reduce kernels rotate their peer pointers). NCCL's (and gloo's) own order follows its
chunking of the message, so from three ranks up it is never batch-invariant, pinned or not: the
pinned arms commit a custom algorithm there (`kernels/selections.py`; a stock engine may well take
NCCL, so it stays legal here). Pinning the algorithm (and the workspace mode) makes the reduction
order independent of the batch.
"""
from __future__ import annotations

from detent_rl.selir import Fact, Runtime, Unpinnable, assume, knob, record, require, selection

KB = 1024
MB = 1024 * KB


@record
class Thresholds:
    one_shot_push: int
    two_shot_push: int
    two_shot_pull: int


@record
class ArConfig:
    graph: Thresholds
    eager: Thresholds
    push_blocks: int
    pull_blocks: int


# Per world size (H200-class, 132 SMs); bytes at or below each threshold take that algorithm.
AR_CONFIGS = {
    2: ArConfig(graph=Thresholds(one_shot_push=16 * MB, two_shot_push=0, two_shot_pull=128 * MB),
                eager=Thresholds(one_shot_push=32 * MB, two_shot_push=0, two_shot_pull=128 * MB),
                push_blocks=132, pull_blocks=64),
    4: ArConfig(graph=Thresholds(one_shot_push=384 * KB, two_shot_push=4 * MB, two_shot_pull=128 * MB),
                eager=Thresholds(one_shot_push=896 * KB, two_shot_push=8 * MB, two_shot_pull=32 * MB),
                push_blocks=132, pull_blocks=64),
    8: ArConfig(graph=Thresholds(one_shot_push=128 * KB, two_shot_push=2 * MB, two_shot_pull=32 * MB),
                eager=Thresholds(one_shot_push=128 * KB, two_shot_push=4 * MB, two_shot_pull=128 * MB),
                push_blocks=132, pull_blocks=64),
}
ALGORITHMS = ("one_shot_push", "two_shot_push", "two_shot_pull", "nccl")


@selection(name="allreduce")
def allreduce_program(nbytes: Unpinnable[int], in_graph: Runtime[bool], world_size: Fact[int],
                      max_nbytes: Fact[int], push_workspace: Fact[int], pull_workspace: Fact[int]):
    assume(16 <= nbytes <= max_nbytes)
    assume(nbytes % 16 == 0)
    cap = knob("workspace_cap", (4 * MB, 16 * MB, 64 * MB), 16 * MB)
    cfg = AR_CONFIGS[world_size]
    t = cfg.graph if in_graph else cfg.eager
    # The workspace caps every custom algorithm, as SGLang clips its tables to max_size.
    if nbytes <= min(t.one_shot_push, push_workspace, cap):
        algorithm = "one_shot_push"
    elif nbytes <= min(t.two_shot_push, push_workspace * world_size // 2, cap):
        algorithm = "two_shot_push"
    elif nbytes <= min(t.two_shot_pull, pull_workspace, cap):
        algorithm = "two_shot_pull"
    else:
        algorithm = "nccl"
    use_graph_buffers = in_graph and algorithm == "two_shot_pull"
    blocks = cfg.push_blocks if algorithm == "one_shot_push" or algorithm == "two_shot_push" else cfg.pull_blocks
    require(algorithm != "one_shot_push" or nbytes <= min(push_workspace, cap),
            "one-shot push stages the whole message in the push workspace")
    require(algorithm != "two_shot_push" or nbytes <= min(push_workspace * world_size // 2, cap),
            "two-shot push stages 2/world_size of the message per rank")
    require(algorithm != "two_shot_pull" or nbytes <= min(pull_workspace, cap),
            "two-shot pull reads peers through the pull buffer")
    # Stated apart (not as `use_graph_buffers` itself) so a pinned value is checked against the
    # real inputs: a condition reading a pinned value sees the pin.
    require(not use_graph_buffers or in_graph, "IPC graph buffers exist only inside a captured graph")
    require(not use_graph_buffers or algorithm == "two_shot_pull", "graph buffers serve two-shot pull only")
    return {"algorithm": algorithm, "use_graph_buffers": use_graph_buffers, "num_blocks": blocks}


# Llama-70B-class hidden size 8192 at TP 8; up to 4096 tokens per step in bf16.
REFERENCE_FACTS = {"world_size": 8, "max_nbytes": 4096 * 8192 * 2, "push_workspace": 16 * MB,
                   "pull_workspace": 128 * MB}

PROGRAM = allreduce_program
