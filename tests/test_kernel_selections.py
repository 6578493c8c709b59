"""Kernel selections per call site: one commitment tuple pins every site; the stock arm reads the batch."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict

import pytest

from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.kernels.selections import Deployment, KernelSelections
from detent_rl.selir import SelectionError, SelIRError

QWEN2_05B = Deployment(num_heads=14, num_kv_heads=2, head_dim=64, hidden=896, vocab=151936)


def test_detent_sites_are_pinned_and_recorded(tmp_path):
    sel = KernelSelections(QWEN2_05B, "detent")
    mm = sel.get("matmul", n=896, k=4864)  # the down projection: the one site whose stock selection splits K
    assert mm.bits(mm(1)) == mm.bits(mm(7)) == mm.bits(mm(4096)) == {"chunk": 640}
    assert mm(1).tile_parallel and not mm(4096).tile_parallel  # the schedule follows M, the partition does not
    att = sel.get("attention")
    assert att.bits(att(1, 1, 1, 10)) == att.bits(att(64, 300, 2000, 4000))
    assert att(1, 1, 1, 10).num_stages < att(64, 300, 2000, 4000).num_stages  # a schedule: decode's own stages
    assert sel.get("rmsnorm")(1) == sel.get("rmsnorm")(1000)
    assert sel.commitment is None  # nothing loaded: the solver's default tuple, resolved in sel's own state
    path = tmp_path / "tuple.json"
    sel.resolved().save(path)
    loaded = CommitmentTuple.load(path)
    again = KernelSelections(QWEN2_05B, "detent", loaded)
    assert again.get("matmul", n=896, k=4864)(3) == mm(3)
    assert set(json.loads(path.read_text())["sites"]) == {"matmul[k=4864][n=896]", "attention", "rmsnorm"}
    assert loaded == sel.resolved() and loaded.sha256() == sel.resolved().sha256()


def test_stock_sites_read_the_batch():
    sel = KernelSelections(QWEN2_05B, "stock")
    assert sel.get("matmul", n=896, k=4864)(1).chunk != sel.get("matmul", n=896, k=4864)(4096).chunk
    assert sel.get("rmsnorm")(1) != sel.get("rmsnorm")(1000)


def test_a_committed_value_is_used_and_an_illegal_one_refused(tmp_path):
    here = asdict(QWEN2_05B)
    t = CommitmentTuple({"matmul[k=4864][n=896]": {"pins": {"chunk": 4864}, "knobs": {"schedule_by_m": True}}},
                        here)
    sel = KernelSelections(QWEN2_05B, "detent", t)
    assert sel.get("matmul", n=896, k=4864)(5).chunk == 4864
    bad_chunk = CommitmentTuple({"matmul[k=4864][n=896]": {"pins": {"chunk": 200}, "knobs": {}}}, here)
    with pytest.raises(SelectionError, match="not among the candidates"):
        KernelSelections(QWEN2_05B, "detent", bad_chunk).get("matmul", n=896, k=4864)
    bad = CommitmentTuple({"attention": {"pins": {"num_splits": 1, "split_size": 128}, "knobs": {}}}, here)
    with pytest.raises(SelectionError, match="splits must cover the longest KV"):
        KernelSelections(QWEN2_05B, "detent", bad).get("attention")


def test_bad_tuple_files_name_what_is_wrong(tmp_path):
    p = tmp_path / "t.json"
    p.write_text("{not json")
    with pytest.raises(SelIRError, match="t.json: cannot be read"):
        CommitmentTuple.load(p)
    p.write_text(json.dumps({"sites": {"matmul[k=1][n=1]": {"pins": {}, "pinz": {}}}}))
    with pytest.raises(SelIRError, match=r"sites.matmul\[k=1\]\[n=1\] has unknown keys \['pinz'\]"):
        CommitmentTuple.load(p)
    with pytest.raises(SelIRError, match="unknown kernel family 'conv'"):
        KernelSelections(QWEN2_05B).get("conv")
    with pytest.raises(SelIRError, match="unknown arm"):
        KernelSelections(QWEN2_05B, "fast")


def test_det_arm_is_one_unsplit_configuration_per_site():
    sel = KernelSelections(QWEN2_05B, "det")
    mm = sel.get("matmul", n=1152, k=896)
    assert mm(1) == mm(7) == mm(8192) and mm(1).chunk == 896 and not mm(1).tile_parallel  # one schedule, no split
    # the deterministic modes' one GEMM config (vLLM's and SGLang's batch-invariant bf16 matmul), on every site
    for n, k in ((1152, 896), (896, 4864), (151936, 896)):
        site = sel.get("matmul", n=n, k=k)
        assert all((s.tile_block_m, s.tile_block_n, s.tile_block_k, s.tile_num_warps, s.tile_num_stages,
                    s.tile_group_m, s.tile_wgmma, s.chunk >= k) == (128, 128, 64, 8, 3, 8, False, True)
                   for s in map(site, (1, 300, 8192))), (n, k)
    att = sel.get("attention")
    one = att(1, 1, 1, 10)
    assert att.bits(one) == att.bits(att(64, 300, 2000, 4000)) == att.bits(att(128, 1, 128, 4096))
    assert one.num_splits == 1 and one.split_size >= QWEN2_05B.max_context  # no split-KV
    assert sel.get("rmsnorm")(1) == sel.get("rmsnorm")(1000)
    assert sel.get("log_softmax")(1) == sel.get("log_softmax")(5000)
    # det takes no tuple; what it resolved to is its own assignment, which the detent arm reproduces
    assert sel.commitment is None
    resolved = sel.resolved()
    assert resolved.sites["matmul[k=896][n=1152]"].pins["chunk"] == 896  # K in one piece
    detent = KernelSelections(QWEN2_05B, "detent", resolved)
    assert detent.get("matmul", n=1152, k=896)(1) == mm(1) and detent.get("attention")(1, 1, 1, 10) == one
    stock = KernelSelections(QWEN2_05B, "stock").get("attention")
    assert stock(1, 1, 1, 4000).num_splits > 1  # the control: stock splits a long decode


def test_the_detent_default_cuts_the_keys_by_the_deployments_context():
    """The default's split: a quarter of a short context (at least 256 keys), 1,024 keys of a long one; a
    context of 256 keys stays whole. Every batch of a deployment cuts at the same keys. The control: the
    solver's own default is one split over the context, whatever its length."""
    from dataclasses import replace

    for context, size in ((256, 256), (784, 256), (2064, 576), (4096, 1024), (8512, 1024)):
        sel = KernelSelections(replace(QWEN2_05B, max_context=context), "detent")
        att = sel.get("attention")
        one, many = att(1, 1, 1, 10), att(64, 1, 64, context)
        assert (one.split_size, one.num_splits) == (size, -(-context // size)), (context, one)
        assert att.bits(one) == att.bits(many)
        default = dict(zip(sel.solution("attention").axes, sel.solution("attention").default))
        assert default.get("num_splits", 1) == 1 and default["split_size"] >= context  # the control


def test_recording_counts_every_site_call_and_graph_replays():
    sel = KernelSelections(QWEN2_05B, "detent")
    mm, norm = sel.get("matmul", n=896, k=4864), sel.get("rmsnorm")
    assert sel.sites() == {"matmul[k=4864][n=896]": ("matmul", {"n": 896, "k": 4864}), "rmsnorm": ("rmsnorm", {})}
    with sel.recording() as calls:
        mm(3), mm(3), norm(7)
        with sel.recording() as captured:  # a CUDA-graph capture records what its replays will run
            mm(16)
        sel.replayed(captured)  # ... and each replay counts it again without calling the selector
        sel.replayed(captured)
    assert calls == {"matmul[k=4864][n=896]": Counter({(3,): 2, (16,): 3}), "rmsnorm": Counter({(7,): 1})}
    mm(5)  # outside: nothing counted, the selector's own path restored
    sel.replayed(captured)
    assert calls["matmul[k=4864][n=896]"][(5,)] == 0 and calls["matmul[k=4864][n=896]"][(16,)] == 3
    assert mm(5) == sel.get("matmul", n=896, k=4864)(5)
