"""`rollout.backend: sglang`'s worker (rollout/sglang_worker.py) against SGLang 0.5.23's own argument,
sampling-parameter and weight-name handling, on the CPU. (The engine itself needs SGLang's CUDA kernels:
its end-to-end run is the GPU command in docs/BENCHMARKS.md.)"""
from __future__ import annotations

import json
import warnings

import pytest
import torch

from sglang_env import import_sglang, plugin_reset

sglang = import_sglang()

from sglang.srt.model_loader.auto_loader import STANDARD_GATE_UP_MAPPING, STANDARD_QKV_MAPPING  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams as SGLangParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from detent_rl.config import RolloutSection  # noqa: E402
from detent_rl.kernels.commitment import CommitmentTuple  # noqa: E402
from detent_rl.models import load_model  # noqa: E402
from detent_rl.models.loader import update_weights  # noqa: E402
from detent_rl.rollout import sglang_model as M  # noqa: E402
from detent_rl.rollout import sglang_plugin as P  # noqa: E402
from detent_rl.rollout import sglang_worker as W  # noqa: E402
from detent_rl.rollout.sequence import SamplingParams  # noqa: E402
from detent_rl.workers import ModelSpec  # noqa: E402

RESET = plugin_reset()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("qwen2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.Qwen2ForCausalLM(cfg).save_pretrained(path)
    return path


def test_engine_arguments_are_sglangs_server_args(checkpoint):
    spec = ModelSpec(path=str(checkpoint), arm="detent", device="cuda", dtype="bfloat16", max_context=784,
                     max_batch=256, max_num_tokens=8192, sglang_tile=256)
    args = W.engine_args(spec, RolloutSection(max_num_seqs=64, chunk_size=512))
    # a msgspec Struct in 0.5.23, a dataclass in 0.5.17
    fields = set(getattr(ServerArgs, "__struct_fields__", None) or ServerArgs.__dataclass_fields__)
    assert set(args) <= fields, sorted(set(args) - fields)
    assert args["attention_backend"] == "triton" and args["skip_tokenizer_init"] and \
        not args["enable_deterministic_inference"]
    assert (args["context_length"], args["max_running_requests"], args["chunked_prefill_size"],
            args["max_prefill_tokens"]) == (784, 64, 512, 8192)


def test_sampling_parameters_are_accepted_by_sglang_and_the_plugin():
    RESET()
    for ours in (SamplingParams(seed=7, temperature=0.7, top_p=0.9, top_k=20, max_tokens=33, stop_token_ids=(2, 5)),
                 SamplingParams(seed=2**62, temperature=0.0, max_tokens=4)):
        theirs = SGLangParams(**W.sampling_params(ours))
        theirs.normalize(None)
        theirs.verify(300)
        P.require_seed(None, theirs)  # the plugin's check passes: the request carries its seed
        assert theirs.sampling_seed == ours.seed and theirs.max_new_tokens == ours.max_tokens and theirs.ignore_eos
        if ours.temperature == 0:  # SGLang's greedy: temperature 1, top-k 1 (token_logprobs' unscaled logits)
            assert (theirs.temperature, theirs.top_k) == (1.0, 1)
        else:
            assert (theirs.temperature, theirs.top_p, theirs.top_k, theirs.stop_token_ids) == (0.7, 0.9, 20, {2, 5})


def test_weights_go_by_the_checkpoints_names_and_come_back_whole(checkpoint):
    model = load_model(checkpoint, "detent", dtype=torch.float32, max_context=256, max_batch=8, max_num_tokens=256)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    named = W.checkpoint_tensors(model, weights)
    saved = set(json.loads((checkpoint / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (checkpoint / "model.safetensors").read_bytes()[:8], "little")]).keys()) - {"__metadata__"}
    assert {n for n, _ in named} == saved  # the names transformers saved: what SGLang's loader reads
    stacked = {src: fused for m in (STANDARD_QKV_MAPPING, STANDARD_GATE_UP_MAPPING) for fused, src, _ in m.mappings}
    for name, _ in named:  # SGLang's own stacking maps each shard back onto our fused parameter's name
        hit = [src for src in stacked if src in name.split(".")]
        if hit:
            assert name.replace(hit[0], stacked[hit[0]]) in weights
    fresh = load_model(checkpoint, "detent", dtype=torch.float32, max_context=256, max_batch=8, max_num_tokens=256)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    update_weights(fresh, named)  # strict: every parameter, every shard
    assert all(torch.equal(p, weights[n]) for n, p in fresh.named_parameters())


def test_an_outputs_tokens_and_logprobs_become_a_completion():
    out = {"output_ids": [5, 9, 2], "meta_info": {"output_token_logprobs": [(-0.5, 5, None), (-1.25, 9, None),
                                                                             (-0.0, 2, None)], "cached_tokens": 3}}
    assert W.completion([1, 2, 3, 4], out) == ([1, 2, 3, 4, 5, 9, 2], 4, [-0.5, -1.25, -0.0], 3)
    out["meta_info"]["output_token_logprobs"] = out["meta_info"]["output_token_logprobs"][1:]
    with pytest.raises(RuntimeError, match="logprobs for tokens"):
        W.completion([1], out)


def test_the_tuple_sglang_reads_is_the_trainers_plus_its_split_tile(checkpoint, tmp_path):
    RESET()
    model = load_model(checkpoint, "detent", dtype=torch.bfloat16, max_context=256, max_batch=8, max_num_tokens=256)
    path = tmp_path / "tuple.json"
    W.commitment_for_sglang(model.selections, 512).save(path)
    assert P.split_tile_size(path) == 512
    again = load_model(checkpoint, "detent", dtype=torch.bfloat16, commitment=CommitmentTuple.load(path),
                       max_context=256, max_batch=8, max_num_tokens=256)  # the sglang site is the plugin's
    assert again.selections.resolved().sites == model.selections.resolved().sites
    assert M.configure(str(path), CommitmentTuple.load(path))  # the plugin pins SGLang's layers to it
    assert M._STATE["selections"].deployment == model.selections.deployment
    RESET()


def test_the_trainer_recomputes_sglangs_rows_and_records_the_same_tuple(checkpoint):
    from detent_rl.config import TrainSection
    from detent_rl.workers import TrainerWorker
    spec = ModelSpec(path=str(checkpoint), arm="detent", device="cpu", dtype="float32", max_context=256,
                     max_batch=8, max_num_tokens=256, sglang_tile=128)
    worker = TrainerWorker(spec, TrainSection())
    assert worker.trainer.sglang == (128, 256)  # completion_logprobs takes SGLang's kernels
    tuple_ = worker.commitment()  # what the run records: the SGLang worker's tuple (record_commitment compares)
    assert tuple_.sha256() == W.commitment_for_sglang(spec.load(device="meta").selections, 128).sha256()
    assert tuple_.sites[P.SITE].knobs["split_tile_size"] == 128
