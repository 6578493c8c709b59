"""The commitment tuple is an input: an immutable value, checked against the model it is loaded into
(deployment, sites, arm), never written by building a model or tuning, and — when every entry is
honoured — what the kernels' parameters are."""
from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest
import torch

from detent_rl.kernels.commitment import CommitmentError, CommitmentTuple, SiteCommitment
from detent_rl.kernels.programs.attention import triton_tile
from detent_rl.kernels.programs.matmul import NARROW_CHOICE, TILE_CHOICES, WGMMA_CHOICE
from detent_rl.models import load_model
from detent_rl.models.builtin import builtin_checkpoint
from detent_rl.models.runner import prefill_batch
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.selir import SelIRError
from detent_rl.tune import Workload, tune
from test_models import LIMITS, hf_model, save

MM = {"n": 128, "k": 256}  # the tiny model's down projection (K = 256: partitions of one or two chunks)
MM_KEY = "matmul[k=256][n=128]"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return builtin_checkpoint("tiny", tmp_path_factory.mktemp("models"))


def _load(path, commitment=None, arm="detent", **limits):
    return load_model(path, arm, device="cpu", dtype=torch.float32, commitment=commitment, **{**LIMITS, **limits})


def _refusal(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message  # one line
    return message


def test_a_tuple_is_an_immutable_value(tmp_path):
    t = CommitmentTuple({MM_KEY: {"pins": {"chunk": 128}, "knobs": {"schedule_by_m": True}}}, {"hidden": 128})
    with pytest.raises(TypeError):
        t.sites["attention"] = SiteCommitment()
    with pytest.raises(TypeError):
        t.sites[MM_KEY].pins["chunk"] = 256
    with pytest.raises(TypeError):
        t.deployment["hidden"] = 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.sites = {}
    other = t.with_sites({MM_KEY: SiteCommitment({"chunk": 256}, {"schedule_by_m": True})})
    assert t.sites[MM_KEY].pins["chunk"] == 128 and other.sites[MM_KEY].pins["chunk"] == 256
    assert other.sha256() != t.sha256() and other.deployment == t.deployment
    # one value whatever its form: the saved and loaded file, a pickle, a deep copy; one hash
    path = t.save(tmp_path / "t.json")
    loaded = CommitmentTuple.load(path)
    assert loaded == t == pickle.loads(pickle.dumps(t)) == copy.deepcopy(t)
    assert loaded.sha256() == t.sha256() and hash(loaded) == hash(t) and loaded.source == str(path)
    assert json.loads(path.read_text()) == t.to_json()
    # in memory as on disk: a tuple-valued pin reads back as the list JSON holds
    assert CommitmentTuple({"x": {"pins": {"p": (1, 2)}}}, {}).sites["x"].pins["p"] == [1, 2]


def test_a_tuple_made_for_another_deployment_is_refused_naming_each_fact(tiny, tmp_path):
    resolved = _load(tiny).selections.resolved()  # max_num_tokens 512, hidden 128
    assert resolved.deployment["max_num_tokens"] == 512
    with pytest.raises(CommitmentError) as e:
        _load(tiny, resolved, max_num_tokens=1024)
    assert _refusal(e) == ("commitment tuple was made for another deployment: max_num_tokens: tuple 512, model 1024 "
                           "(make one for this deployment with `python -m detent_rl.tune --recipe RECIPE --out FILE`)")
    other = save(hf_model("qwen2"), tmp_path / "other")  # hidden 256, vocab 300
    path = resolved.save(tmp_path / "tiny.json")
    with pytest.raises(CommitmentError) as e:
        _load(other, CommitmentTuple.load(path), max_context=512)
    message = _refusal(e)
    assert message.startswith(f"commitment tuple {path} was made for another deployment: ")
    for fact in ("hidden: tuple 128, model 256", "vocab: tuple 320, model 300", "max_context: tuple 256, model 512"):
        assert fact in message
    assert "max_num_tokens" not in message  # equal facts are not named
    # a recorded fact the model does not know of (or the reverse) differs too
    odd = CommitmentTuple(resolved.sites, {**resolved.deployment, "tp": 2})
    with pytest.raises(CommitmentError, match=r"deployment: tp: tuple 2, model \(absent\) \("):
        _load(tiny, odd)


def test_a_tuple_without_deployment_is_refused(tiny, tmp_path):
    sites = _load(tiny).selections.resolved().sites
    path = tmp_path / "bare.json"
    path.write_text(json.dumps({"sites": {k: v.to_json() for k, v in sites.items()}}))
    with pytest.raises(CommitmentError) as e:
        _load(tiny, CommitmentTuple.load(path))
    assert _refusal(e) == (f"commitment tuple {path} records no deployment, so nothing shows its pins were chosen "
                           f"for this model; make one with `python -m detent_rl.tune --recipe RECIPE --out FILE`")


@pytest.mark.parametrize("arm", ["stock", "det"])
def test_a_tuple_given_to_an_arm_that_would_ignore_it_is_refused(tiny, arm):
    resolved = _load(tiny).selections.resolved()
    with pytest.raises(CommitmentError) as e:
        _load(tiny, resolved, arm=arm)
    assert _refusal(e) == (f"commitment tuple pins the detent arm, and the {arm} arm would ignore it: "
                           f"run the detent arm, or load no tuple")
    with pytest.raises(CommitmentError, match="the stock arm pins nothing"):
        _load(tiny, arm="stock").selections.resolved()


def test_an_entry_for_a_site_the_model_lacks_is_refused(tiny, tmp_path):
    resolved = _load(tiny).selections.resolved()
    extra = resolved.with_sites({"matmul[k=7][n=9]": SiteCommitment({"chunk": 128}, {"schedule_by_m": True})})
    with pytest.raises(CommitmentError) as e:
        _load(tiny, extra)
    assert _refusal(e).startswith("commitment tuple has entries for sites this model does not have: "
                                  "[matmul[k=7][n=9]]; the model's sites: [attention, elementwise[width=128], ")
    assert "(+" in str(e.value)  # the known sites' list is truncated
    # another model of the same deployment facts (hidden, heads, vocab...) but another MLP width: only
    # the sites tell them apart
    wider = save(hf_model("qwen2", intermediate_size=384), tmp_path / "wider")
    narrow = save(hf_model("qwen2"), tmp_path / "narrow")
    with pytest.raises(CommitmentError, match=r"does not have: \[elementwise\[width=512\], matmul\[k=256\]\[n=1024\]"):
        _load(wider, _load(narrow).selections.resolved())
    with pytest.raises(SelIRError):  # a CommitmentError is a SelIRError
        _load(tiny, extra)


def test_building_a_model_and_tuning_leave_the_tuple_as_it_was(tiny, tmp_path):
    path = _load(tiny).selections.resolved().save(tmp_path / "t.json")
    text = path.read_text()
    t = CommitmentTuple.load(path)
    frozen = t.canonical_json()
    model = _load(tiny, t)
    assert model.selections.commitment is t and t.canonical_json() == frozen
    before = model.selections.resolved()
    tuned, _ = tune(model, Workload(prompts=2, prompt_len=8, new_tokens=2), repeats=1, log=lambda _: None)
    assert t.canonical_json() == frozen and path.read_text() == text
    assert model.selections.resolved() == before == t  # the model still runs what it was built with
    assert tuned is not t and set(tuned.sites) == set(t.sites)


def test_an_honoured_tuple_sets_the_kernels_parameters(tiny, tmp_path):
    default = _load(tiny)
    resolved = default.selections.resolved()
    matmul_sites = [k for k in resolved.sites if k.startswith("matmul")]
    # the default: the partition a one-row decode gets from the stock selection (two chunks here)
    assert resolved.sites[MM_KEY].pins["chunk"] == 128 and resolved.sites["attention"].pins["split_size"] == 256
    chosen = {k: SiteCommitment({"chunk": 256} if k == MM_KEY else {},
                                {**resolved.sites[k].knobs, "schedule_by_m": False}) for k in matmul_sites}
    chosen["attention"] = SiteCommitment({"block_n": 128, "split_size": 512}, {"split_stride": 0})
    path = resolved.with_sites(chosen).save(tmp_path / "chosen.json")
    committed = _load(tiny, CommitmentTuple.load(path))
    assert committed.selections.resolved() == CommitmentTuple.load(path)  # every entry honoured as written

    def matmul_launch(model, m):
        s = model.selections.get("matmul", **MM)(m)
        return s.chunk, s.tile_block_m, s.tile_block_n, s.tile_block_k

    largest = TILE_CHOICES[8192][WGMMA_CHOICE]  # K > N: the warpgroup-MMA tile
    smallest = TILE_CHOICES[32][NARROW_CHOICE]  # the default's 16 x 32 tile at M <= 16 (two 16 x 64 tiles)
    for m in (1, 5, 300):
        assert matmul_launch(committed, m) == (256, largest.block_m, largest.block_n, largest.block_k)
    assert matmul_launch(default, 1) == (128, smallest.block_m, smallest.block_n, smallest.block_k)  # the control
    for batch, rows in (((1, 1, 1, 200), 16), ((4, 100, 300, 200), 64)):  # the query tile follows the step
        att, att0 = committed.select_attention(*batch), default.select_attention(*batch)
        assert (att.block_m, att.block_n, att.split_size) == (rows, triton_tile.fn(False)[1], 512)
        assert (att0.block_m, att0.block_n, att0.split_size) == (rows, triton_tile.fn(True)[1], 256)
    # and they reach the bits: the same request (its prompt spans two of the default's 64-key attention
    # tiles, one of the committed 128-key tiles) gives other logits, while the default tuple written
    # out and loaded back gives the default's bits exactly. (Logits, every prompt position: a 2-layer
    # fp32 model's few sampled logprobs can round the difference away — they did on one CPU.)
    prompts, params = [[(7 * i) % 300 + 3 for i in range(100)]], [SamplingParams(seed=0, temperature=1.0, max_tokens=4)]
    reloaded = _load(tiny, CommitmentTuple.load(resolved.save(tmp_path / "default.json")))
    runs = [Engine(m, num_blocks=16).generate(prompts, params)[0] for m in (default, reloaded, committed)]
    assert runs[0].logprobs == runs[1].logprobs and runs[0].completion == runs[1].completion
    logits = [prefill_batch(m, m.allocate_kv_cache(8), prompts)[0] for m in (default, reloaded, committed)]
    assert torch.equal(logits[0], logits[1]) and not torch.equal(logits[2], logits[0])
