"""Model code on the CPU: HF checkpoints of tiny random Llama / Qwen2 / Qwen3 models load and give
transformers' logits; a sequence's logits are bit-identical alone, inside a batch, and as prefix
prefill + decode under the detent arm, while the stock arm visibly is not; bad checkpoints are
refused with messages that name the file and the key or tensor."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

import detent_rl.kernels.autograd as autograd
from detent_rl.kernels.selections import KernelSelections
from detent_rl.models import (CausalLM, WeightsError, ModelConfig, ModelConfigError, deployment_for,
                              get_context, load_model, set_context)
from detent_rl.models.runner import SequenceRunner, completion_logprobs, prefill_batch

VOCAB = 300
BASE = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)
FAMILIES = {  # qwen3 with an explicit head_dim other than hidden / heads
    "llama": {}, "qwen2": {}, "qwen3": {"head_dim": 32},
}
LENGTHS = (7, 23, 41)  # across 16-token pages and query tiles
LIMITS = dict(max_context=256, max_batch=16, max_num_tokens=512)
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def hf_model(family: str, seed: int = 0, **overrides) -> torch.nn.Module:
    import transformers
    transformers.logging.set_verbosity_error()
    names = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    config = getattr(transformers, f"{names}Config")(**{**BASE, **FAMILIES[family], **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, f"{names}ForCausalLM")(config).eval()
    with torch.no_grad():  # weights far from HF's init (unit norms, zero biases) so a mis-load shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0, 0.1 if p.dim() == 1 else 0.06)
    return model


def save(model: torch.nn.Module, root: Path, sharded: bool = False) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(root, max_shard_size="200KB" if sharded else "1GB")
    assert (root / "model.safetensors.index.json").is_file() == sharded
    return root


def sequences(seed: int, lengths: tuple[int, ...] = LENGTHS) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def hf_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens], device=model.device)).logits[0]


# ---------------------------------------------------------------------------------------------
# logits against transformers

@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers_fp32(family, sharded, tmp_path):
    hf = hf_model(family)
    model = load_model(save(hf, tmp_path, sharded), "detent", "cpu", torch.float32, **LIMITS)
    assert model.config.qk_norm == (family == "qwen3") and model.config.attention_bias == (family == "qwen2")
    seqs = sequences(1)
    out = prefill_batch(model, model.allocate_kv_cache(16), seqs)
    for tokens, logits in zip(seqs, out):
        torch.testing.assert_close(logits, hf_logits(hf, tokens), **TOL[torch.float32])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers_bf16(family, tmp_path):
    hf = hf_model(family)
    model = load_model(save(hf, tmp_path), "detent", "cpu", torch.bfloat16, **LIMITS)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    hf_bf16 = hf_model(family).to(torch.bfloat16)
    seqs = sequences(2)
    for tokens, logits in zip(seqs, prefill_batch(model, model.allocate_kv_cache(16), seqs)):
        exact, theirs = hf_logits(hf, tokens), hf_logits(hf_bf16, tokens).float()
        # bf16 keeps 8 bits and the two computations round at different places: ours must be as
        # close to the fp32 logits as transformers' own bf16 forward is (measured: within ~10 %).
        ours_err, their_err = (logits.float() - exact).abs().max(), (theirs - exact).abs().max()
        assert ours_err <= 1.5 * their_err + 1e-2, (family, ours_err, their_err)
        assert (logits.float() - theirs).abs().max() <= 0.03 * exact.abs().max(), family


def test_tied_embeddings_share_one_tensor(tmp_path):
    hf = hf_model("llama", tie_word_embeddings=True)
    root = save(hf, tmp_path)
    with safe_open(str(root / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
    model = load_model(root, "detent", "cpu", torch.float32, **LIMITS)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    seqs = sequences(3, (5, 30))
    for tokens, logits in zip(seqs, prefill_batch(model, model.allocate_kv_cache(8), seqs)):
        torch.testing.assert_close(logits, hf_logits(hf, tokens), **TOL[torch.float32])


@pytest.mark.parametrize("grad", [False, True])
def test_forward_runs_only_our_kernels(tmp_path, monkeypatch, grad):
    model = load_model(save(hf_model("qwen3"), tmp_path), "detent", "cpu", torch.float32, **LIMITS)
    for name in ("linear", "embedding", "silu", "rms_norm", "scaled_dot_product_attention", "softmax"):
        monkeypatch.setattr(F, name, _forbidden(name))
    monkeypatch.setenv("DETENT_GATED_MLP", "0")  # (on: gate/up and SiLU-and-mul in one op, test_kernels_matmul_gated)
    calls: dict[str, int] = {}
    kernels = ("linear", "rmsnorm", "embedding", "silu_and_mul", "apply_rotary", "rotary_store", "store_kv",
               "paged_attention")
    for name in kernels:  # the layers reach every kernel launcher through kernels.autograd's <op>_autograd
        monkeypatch.setattr(autograd, name, _counted(getattr(autograd, name), name, calls))
    seqs = sequences(4, (9, 12))
    if grad:  # the trainer's forward: every op recorded for its backward
        for p in model.parameters():
            p.requires_grad_(True)
        completion_logprobs(model, [(s, 3) for s in seqs], [1.0] * len(seqs))
    else:
        prefill_batch(model, model.allocate_kv_cache(8), seqs)
    n = model.config.num_hidden_layers
    # without a gradient rotary and the k/v store are one launch per layer; with one, the two calls
    rotary = {"apply_rotary": n, "store_kv": n} if grad else {"rotary_store": n}
    assert calls == {"embedding": 1, "rmsnorm": 4 * n + 1, "linear": 4 * n + 1, "paged_attention": n,
                     "silu_and_mul": n, **rotary}


def _forbidden(name: str):
    def fail(*args, **kwargs):
        raise AssertionError(f"the forward called torch.nn.functional.{name}")
    return fail


def _counted(fn, name: str, calls: dict):
    def wrapper(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return fn(*args, **kwargs)
    return wrapper


# ---------------------------------------------------------------------------------------------
# batch invariance: alone == inside a batch == prefix prefill + decode, bit for bit

def invariance_failures(model: CausalLM, seed: int) -> list[str]:
    """Every way a sequence's logits differ from its logits computed alone, for each of four
    sequences: inside one batch (in another row order) and as prefix prefill + batched decode."""
    seqs = sequences(seed, (37, 12, 90, 21))
    alone = [SequenceRunner(model, 1, 96).step([(0, s)])[0] for s in seqs]
    order = [2, 0, 3, 1]
    runner = SequenceRunner(model, 4, 96)
    out = runner.step([(i, seqs[i]) for i in order])
    batch = [out[order.index(i)] for i in range(len(seqs))]
    runner = SequenceRunner(model, 4, 96)
    prefixes = (9, 5, 30, 1)
    rows = [[r] for r in runner.step([(i, s[:n]) for i, (s, n) in enumerate(zip(seqs, prefixes))])]
    for p in range(min(prefixes), max(len(s) for s in seqs)):  # one decode step: every sequence past its prefix
        work = [(i, [s[p]]) for i, (s, n) in enumerate(zip(seqs, prefixes)) if n <= p < len(s)]
        for (i, _), r in zip(work, runner.step(work)):
            rows[i].append(r)
    decoded = [torch.cat(r) for r in rows]
    failures = []
    for name, got in (("in a batch of 4", batch), ("prefix prefill + decode", decoded)):
        for i, (g, a) in enumerate(zip(got, alone)):
            bad = (g != a).any(-1).nonzero().flatten().tolist()
            if bad:
                diff = (g.float() - a.float()).abs().max().item()
                failures.append(f"sequence {i} {name}: positions {bad[:8]} differ from alone (max |diff| {diff:.3g})")
    return failures


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_batch_invariance_detent(family, dtype, tmp_path):
    model = load_model(save(hf_model(family), tmp_path), "detent", "cpu", DTYPES[dtype], **LIMITS)
    assert invariance_failures(model, seed=5) == []


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_batch_invariance_stock_fails(dtype, tmp_path):
    """Negative control: the stock arm's batch-dependent selection must change some bits."""
    model = load_model(save(hf_model("llama"), tmp_path), "stock", "cpu", DTYPES[dtype], **LIMITS)
    failures = invariance_failures(model, seed=5)
    assert failures, "the stock arm gave bit-identical logits: the invariance check cannot fail"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_gpu_logits_and_batch_invariance(family, dtype, tmp_path):
    """The Triton path: transformers' logits (fp32 tight, bf16 as close to fp32 as HF's own bf16),
    and bit-identical logits alone / in a batch / as prefill + decode under the detent arm."""
    hf = hf_model(family)
    model = load_model(save(hf, tmp_path), "detent", "cuda", DTYPES[dtype], **LIMITS)
    hf = hf.cuda()
    seqs = sequences(1)
    hf_low = hf_model(family).to("cuda", DTYPES[dtype])
    for tokens, logits in zip(seqs, prefill_batch(model, model.allocate_kv_cache(16), seqs)):
        exact, theirs = hf_logits(hf, tokens), hf_logits(hf_low, tokens).float()
        err, their_err = (logits.float() - exact).abs().max(), (theirs - exact).abs().max()
        assert err <= (1e-3 if dtype == "fp32" else 1.5 * their_err + 1e-2), (family, err, their_err)
    assert invariance_failures(model, seed=5) == []


@pytest.mark.gpu
def test_gpu_batch_invariance_stock_fails(tmp_path):
    model = load_model(save(hf_model("llama"), tmp_path), "stock", "cuda", torch.bfloat16, **LIMITS)
    assert invariance_failures(model, seed=5), "the stock arm gave bit-identical logits on the GPU"


# ---------------------------------------------------------------------------------------------
# bad inputs

def test_missing_config(tmp_path):
    with pytest.raises(ModelConfigError, match=f"{tmp_path}/config.json: no such config file"):
        load_model(tmp_path, "detent")


def test_config_errors_name_file_and_key(tmp_path):
    root = save(hf_model("llama"), tmp_path)
    raw = json.loads((root / "config.json").read_text())
    cases = [({"model_type": "mistral"}, "model_type 'mistral' is not supported"),
             ({"hidden_size": None}, "required key 'hidden_size' is missing"),
             ({"num_hidden_layers": "2"}, "num_hidden_layers must be a positive integer, got '2'"),
             ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
             ({"layer_types": ["full_attention", "sliding_attention"]},
              r"layer_types has non-full-attention layers \[1\]")]
    for change, message in cases:
        (root / "config.json").write_text(json.dumps({**raw, **change}))
        with pytest.raises(ModelConfigError, match=f"{root}/config.json: {message}"):
            load_model(root, "detent")


def _rewrite_checkpoint(root: Path, edit) -> None:
    with safe_open(str(root / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(tensors)
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})


def test_checkpoint_errors_name_the_tensors(tmp_path):
    root = save(hf_model("qwen2"), tmp_path)

    def drop(t):
        del t["model.layers.1.self_attn.k_proj.bias"], t["lm_head.weight"]
        t["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    _rewrite_checkpoint(root, drop)
    with pytest.raises(WeightsError, match=r"missing tensors \['lm_head.weight', "
                                              r"'model.layers.1.self_attn.k_proj.bias'\]; "
                                              r"unexpected tensors \['model.layers.0.mlp.extra_proj.weight'\]"):
        load_model(root, "detent", "cpu", torch.float32, **LIMITS)

    root = save(hf_model("qwen2"), tmp_path / "b")
    _rewrite_checkpoint(root, lambda t: t.update({"model.layers.0.self_attn.v_proj.weight": torch.zeros(3, 256)}))
    with pytest.raises(WeightsError, match=r"model.safetensors: tensor model.layers.0.self_attn.v_proj.weight: "
                                              r"shape \(3, 256\) does not fit the parameter's \(128, 256\)"):
        load_model(root, "detent", "cpu", torch.float32, **LIMITS)

    (root / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match="no model.safetensors or model.safetensors.index.json"):
        load_model(root, "detent", "cpu", torch.float32, **LIMITS)


def test_selections_of_another_model_are_refused(tmp_path):
    config = ModelConfig.from_file(save(hf_model("llama"), tmp_path))
    other = ModelConfig.from_dict({**config.raw, "num_key_value_heads": 4})
    sel = KernelSelections(deployment_for(other, torch.float32), "detent")
    with pytest.raises(ValueError, match="num_kv_heads: deployment 4 vs model 2"):
        CausalLM(config, sel, "cpu", torch.float32)


def test_context_is_reset_after_an_error():
    with pytest.raises(RuntimeError, match="no forward context is set"):
        get_context()
    ctx = object()
    with pytest.raises(KeyError):
        with set_context(ctx):  # type: ignore[arg-type]
            assert get_context() is ctx
            raise KeyError("boom")
    with pytest.raises(RuntimeError, match="no forward context is set"):
        get_context()


# ---------------------------------------------------------------------------------------------
# built-in models: one registry, a name is one checkpoint and one set of weights

def test_every_builtin_name_resolves_to_one_checkpoint(tmp_path, monkeypatch):
    import typing

    from detent_rl.config import ModelSection
    from detent_rl.models import builtin

    made = []

    def write(out, config, init, seed=builtin.SEED):
        made.append((out.name, init))
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(config))
        return out

    monkeypatch.setattr(builtin, "write_checkpoint", write)
    monkeypatch.setattr(builtin, "smollm2_checkpoint", lambda cache_dir=None: Path(cache_dir) / "smollm2")
    first = {name: builtin.builtin_checkpoint(name, tmp_path) for name in builtin.NAMES}
    assert len(set(first.values())) == len(builtin.NAMES)
    assert {name: builtin.builtin_checkpoint(name, tmp_path) for name in builtin.NAMES} == first
    assert sorted(made) == sorted((first[n].name, b.init) for n, b in builtin.BUILTINS.items() if b.init != "gguf")
    for name, b in builtin.BUILTINS.items():
        if b.config is not None:  # the battery reads these configs without making the weights
            assert ModelConfig.from_dict(b.config).vocab_size == b.config["vocab_size"]
    recipe_names = typing.get_args(typing.get_args(typing.get_type_hints(ModelSection)["builtin"])[0])
    assert recipe_names and set(recipe_names) <= set(builtin.NAMES)
    with pytest.raises(ValueError, match="unknown built-in model 'nope'; known: smollm2-135m-instruct, tiny"):
        builtin.builtin_checkpoint("nope", tmp_path)


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2"])
def test_two_resolutions_of_a_builtin_give_identical_weights(name, tmp_path):
    from detent_rl.models.builtin import builtin_checkpoint
    from detent_rl.models.weights import weights_sha256

    rng = torch.random.get_rng_state()
    a, b = builtin_checkpoint(name, tmp_path / "a"), builtin_checkpoint(name, tmp_path / "b")
    assert torch.equal(torch.random.get_rng_state(), rng), "making weights must leave the global RNG alone"
    assert a.name == b.name and (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.joinpath("a").iterdir()) == [a.name]  # no temporaries left
    if name == "tiny-qwen2":  # the battery's default model keeps the weights its documented results had
        model = load_model(a, "detent", "cpu", torch.float32)
        assert weights_sha256(model) == "ea87305cf243ff84797c5148b8589d9cabd6085685b4ba6587014f5f2b175cd3"
