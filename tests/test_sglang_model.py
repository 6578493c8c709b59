"""SGLang's own model layers under the plugin's model-kernel hooks (rollout/sglang_model.py), on the CPU.

With a commitment tuple that records its deployment, SGLang's dense linear method, LM head, RMSNorm,
SiluAndMul and rotary embedding run detent_rl's pinned kernels, so each gives the trainer's kernels'
bits and a row's bits do not follow the batch. Control: SGLang's stock linear method (F.linear) on the
same rows changes a row's bits with the token count. The layers are SGLang 0.5.23's classes, their
hooks applied by SGLang's HookRegistry.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_env import import_sglang, plugin_reset

sglang = import_sglang()

from sglang.srt.layers.activation import SiluAndMul  # noqa: E402
from sglang.srt.layers.layernorm import RMSNorm  # noqa: E402
from sglang.srt.layers.logits_processor import LogitsProcessor  # noqa: E402
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod  # noqa: E402
from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402

from detent_rl.kernels.matmul import launch_params, linear  # noqa: E402
from detent_rl.kernels.rmsnorm import rmsnorm  # noqa: E402
from detent_rl.kernels.rotary import apply_rotary, rope_cos_sin  # noqa: E402
from detent_rl.kernels.selections import Deployment, KernelSelections  # noqa: E402
from detent_rl.kernels.silu_and_mul import silu_and_mul  # noqa: E402
from detent_rl.models.config import ModelConfig  # noqa: E402
from detent_rl.rollout import sglang_model as M  # noqa: E402
from detent_rl.rollout import sglang_plugin as P  # noqa: E402

RESET = plugin_reset()
DT = torch.float32  # fp32: where the CPU's own GEMM (the control) visibly follows the row count
# a Qwen2-shaped deployment: 4 heads / 2 KV heads x 64, hidden 256, MLP 1024, vocabulary 512
DEPLOYMENT = Deployment(num_heads=4, num_kv_heads=2, head_dim=64, hidden=256, vocab=512, dtype_bytes=4,
                        max_context=512, max_batch=64, max_num_tokens=512)
SITES = (("matmul", dict(n=384, k=256)), ("matmul", dict(n=256, k=1024)), ("matmul", dict(n=512, k=256)),
         ("rmsnorm", dict(hidden=256)), ("elementwise", dict(width=1024)), ("elementwise", dict(width=256)))


@pytest.fixture()
def pinned(tmp_path):
    """The trainer's selections for DEPLOYMENT, their tuple written and given to the plugin, hooks applied."""
    RESET()
    selections = KernelSelections(DEPLOYMENT, "detent")
    for family, site in SITES:
        selections.get(family, **site)
    path = tmp_path / "tuple.json"
    selections.resolved().save(path)
    P.register(path)
    HookRegistry.apply_hooks()
    assert M.pinned()
    yield selections
    RESET()


def rows_alone_and_in_batches(fn, x: torch.Tensor, sizes=(1, 3, 17, 64, 200)) -> set:
    """Row 0's output bits, computed with the first m rows of x for each m."""
    return {fn(x[:m])[0].numpy().tobytes() for m in sizes}


def test_sglangs_linear_method_runs_the_pinned_linear_and_keeps_a_rows_bits(pinned):
    torch.manual_seed(0)
    layer = SimpleNamespace(weight=(torch.randn(256, 1024) * 0.03).to(DT))
    x = torch.randn(200, 1024).to(DT)
    method = UnquantizedLinearMethod()
    ours = linear(x, layer.weight, None, **launch_params(pinned.get("matmul", n=256, k=1024)(200)))
    assert torch.equal(method.apply(layer, x), ours)  # the trainer's kernel, the trainer's pins
    assert len(rows_alone_and_in_batches(lambda rows: method.apply(layer, rows), x)) == 1
    if hasattr(method, "apply_with_addend"):  # a fused-residual GEMM (not in 0.5.17): no trainer counterpart
        with pytest.raises(M.SGLangModelError, match="apply_with_addend"):
            method.apply_with_addend(layer, x, x[:, :256])
    # control: SGLang's stock linear method (F.linear) gives row 0 other bits as the token count moves
    RESET()
    assert len(rows_alone_and_in_batches(lambda rows: UnquantizedLinearMethod().apply(layer, rows), x)) > 1


def test_the_lm_head_norm_activation_and_rotary_run_the_trainers_kernels(pinned):
    torch.manual_seed(1)
    h = torch.randn(40, 256).to(DT)
    # the LM head (SGLang's _compute_lm_head, now the pinned linear of the vocabulary site)
    lm_head = SimpleNamespace(weight=(torch.randn(512, 256) * 0.05).to(DT))
    proc = SimpleNamespace(use_fp32_lm_head=False)
    logits = LogitsProcessor._compute_lm_head(proc, h, lm_head)
    assert torch.equal(logits, linear(h, lm_head.weight, None,
                                      **launch_params(pinned.get("matmul", n=512, k=256)(40))))
    assert len(rows_alone_and_in_batches(lambda r: LogitsProcessor._compute_lm_head(proc, r, lm_head), h,
                                         (1, 7, 40))) == 1
    # RMSNorm, alone and with the residual added first (fused_add_rmsnorm's order)
    norm = RMSNorm(256, eps=1e-6).to(DT)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(256) + 0.5)
    res = torch.randn(40, 256).to(DT)
    s = pinned.get("rmsnorm", hidden=256)(40)
    assert torch.equal(norm(h), rmsnorm(h, norm.weight, 1e-6, block=s.block, num_warps=s.num_warps))
    out, total = norm(h, res)
    want_out, want_total = rmsnorm(h, norm.weight, 1e-6, block=s.block, num_warps=s.num_warps, residual=res)
    assert torch.equal(out, want_out) and torch.equal(total, want_total) and torch.equal(total, h + res)
    # SiluAndMul
    g = torch.randn(40, 2048).to(DT)
    act = SiluAndMul.__new__(SiluAndMul)  # 0.5.17's constructor reads a server's runtime context; forward reads nothing
    torch.nn.Module.__init__(act)
    assert torch.equal(act(g), silu_and_mul(g, block=pinned.get("elementwise", width=1024)(40).block))
    # the rotary embedding rotates by the trainer's own cos/sin table (built from the model's config)
    rope = RotaryEmbedding.__new__(RotaryEmbedding)  # its CPU constructor imports vLLM; forward reads these
    torch.nn.Module.__init__(rope)
    rope.head_size = rope.rotary_dim = 64
    rope.max_position_embeddings, rope.base, rope.is_neox_style = 512, 1000000, True
    config = ModelConfig.from_dict(dict(model_type="qwen2", vocab_size=512, hidden_size=256, intermediate_size=1024,
                                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0))
    cos, sin = rope_cos_sin(config.hf_config, 512, "cpu", DT)  # what the trainer's model builds
    pos = torch.tensor([0, 5, 130, 511, 7] * 8)
    q, k = torch.randn(40, 4 * 64).to(DT), torch.randn(40, 2 * 64).to(DT)
    rq, rk = rope(pos, q, k)
    wq, wk = apply_rotary(q.view(40, 4, 64), k.view(40, 2, 64), pos, cos, sin,
                          block=pinned.get("elementwise", width=256)(40).block)
    assert torch.equal(rq, wq.reshape(40, 256)) and torch.equal(rk, wk.reshape(40, 128))
    scaled = type("ScaledRope", (RotaryEmbedding,), {})
    odd = scaled.__new__(scaled)
    odd.is_neox_style = True
    with pytest.raises(M.SGLangModelError, match="plain neox-style"):
        M.pinned_rotary(odd, pos, q, k)


def test_no_deployment_no_model_hooks_and_a_token_bound_refused(pinned, tmp_path):
    # a row count past the deployment's token bound is refused before any kernel runs
    layer = SimpleNamespace(weight=torch.zeros(256, 1024, dtype=DT))
    with pytest.raises(Exception, match="assum|max_m|violat"):
        UnquantizedLinearMethod().apply(layer, torch.zeros(513, 1024, dtype=DT))
    # a tuple without a deployment: the model hooks stay off (the selection hooks work as before)
    RESET()
    path = tmp_path / "bare.json"
    path.write_text('{"sites": {}}')
    P.register(path)
    assert not M.pinned() and not P._STATE["model_hooks"]


def test_the_trainers_logprobs_are_sglangs_deterministic_samplers():
    """SGLang's deterministic sampler returns log_softmax(logits.div_(temperatures [rows, 1])); the trainer's
    `token_logprobs` divides by a tensor the same way (a scalar divisor is another operation on the GPU)."""
    torch.manual_seed(2)
    logits = torch.randn(6, 512) * 4
    tokens = torch.tensor([1, 5, 9, 300, 511, 0])
    temps = torch.full((6, 1), 0.7)
    want = torch.log_softmax(logits.clone().div_(temps), dim=-1)[torch.arange(6), tokens]
    assert torch.equal(M.token_logprobs(logits.to(torch.bfloat16).float(), tokens, 0.7),
                       torch.log_softmax(logits.to(torch.bfloat16).float().div_(temps), -1)[torch.arange(6), tokens])
    assert torch.equal(M.token_logprobs(logits, tokens, 0.7), want)
    assert torch.equal(M.token_logprobs(logits, tokens, 0.0), torch.log_softmax(logits, -1)[torch.arange(6), tokens])


def test_the_trainer_reproduces_sglangs_rollout_logprobs_model_wide_interpreted():
    """A Qwen2-shaped model (from transformers' save_pretrained), rolled out the way SGLang's Qwen2 runs it
    under the plugin — SGLang's own RMSNorm, linear method, SiluAndMul, rotary, LM head (hooked) and
    its own Triton extend/decode kernels, prompts prefilled in chunks and each completion token decoded
    among other requests — then its completion logprobs recomputed by the trainer in one pass
    (`completion_logprobs(..., sglang=(tile, context))`): every logprob equal, bit for bit. Control: the
    trainer's own attention (the embedded engine's kernels) misses them."""
    from interpreted import run_interpreted
    from sglang_env import PRELUDE
    proc = run_interpreted(PRELUDE + """
import tempfile, warnings
from itertools import accumulate
from types import SimpleNamespace
import torch, transformers
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_decode_cases import sglang_rollout_rows
from detent_rl.models import load_model
from detent_rl.models.runner import completion_logprobs
from detent_rl.rollout import sglang_plugin as P
import detent_rl.kernels.matmul as MM
# SGLang's attention kernels run interpreted; our linear takes its CPU mirror: interpreted, its tl.dot is
# numpy's per tile, whose bits follow the tile (an interpreter artifact the GPU tests do not share)
MM.interpreting = lambda: False
transformers.logging.set_verbosity_error()
H, KVH, D, HID, TILE, CTX = 4, 2, 16, 64, 64, 128
torch.manual_seed(0)
cfg = transformers.Qwen2Config(vocab_size=300, hidden_size=HID, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=H, num_key_value_heads=KVH, max_position_embeddings=CTX,
                               rope_theta=10000.0, tie_word_embeddings=True)
tmp = tempfile.mkdtemp()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp)
model = load_model(tmp, "detent", dtype=torch.float32, max_context=CTX, max_batch=8, max_num_tokens=256)
model.selections.resolved().save(tmp + "/tuple.json")
P.register(tmp + "/tuple.json")
HookRegistry.apply_hooks()
seqs = [[int(t) for t in torch.randint(0, 300, (n,))] for n in (90, 40)]
prompts, temps = [20, 12], [0.7, 1.0]

@torch.no_grad()
def sglang_rollout():
    m, lin = model.model, UnquantizedLinearMethod()
    cu = [0, *accumulate(len(s) for s in seqs)]
    T = cu[-1]
    pos = torch.cat([torch.arange(len(s)) for s in seqs])
    def rms(w):
        n = RMSNorm(HID, eps=1e-6)
        n.weight = torch.nn.Parameter(w.detach().clone(), requires_grad=False)
        return n
    rope = RotaryEmbedding.__new__(RotaryEmbedding)
    torch.nn.Module.__init__(rope)
    rope.head_size = rope.rotary_dim = D
    rope.max_position_embeddings, rope.base, rope.is_neox_style = CTX, 10000, True
    act = SiluAndMul.__new__(SiluAndMul)  # 0.5.17's constructor reads a server's runtime context
    torch.nn.Module.__init__(act)
    h = torch.nn.functional.embedding(torch.tensor(sum(seqs, [])), m.embed_tokens.weight)
    residual = None
    for i, layer in enumerate(m.layers):
        a = layer.self_attn
        if residual is None:
            residual, x = h, rms(layer.input_layernorm.weight)(h)
        else:
            x, residual = rms(layer.input_layernorm.weight)(h, residual)
        qkv = lin.apply(a.qkv_proj, x, a.qkv_proj.bias)
        q, k, v = qkv.split([H * D, KVH * D, KVH * D], dim=-1)
        q, k = rope(pos, q, k)
        o = sglang_rollout_rows(q.reshape(T, H, D), k.reshape(T, KVH, D), v.reshape(T, KVH, D), cu, prompts,
                                tile=TILE, context=CTX, seed=i)
        x = lin.apply(a.o_proj, o.reshape(T, H * D))
        x, residual = rms(layer.post_attention_layernorm.weight)(x, residual)
        h = lin.apply(layer.mlp.down_proj, act(lin.apply(layer.mlp.gate_up_proj, x)))
    h, _ = rms(m.norm.weight)(h, residual)
    out = []
    for s, p, t, a in zip(seqs, prompts, temps, cu):
        logits = LogitsProcessor._compute_lm_head(SimpleNamespace(use_fp32_lm_head=False), h[a + p - 1:a + len(s) - 1],
                                                  model.lm_head).float()
        logits.div_(torch.full((len(s) - p, 1), t))  # SGLang's sampler: temperatures [rows, 1], in place
        out.append(torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(s[p:]).view(-1, 1)).squeeze(1))
    return out

rolled = sglang_rollout()
with torch.no_grad():
    trained = completion_logprobs(model, list(zip(seqs, prompts)), temps, sglang=(TILE, CTX))
    own = completion_logprobs(model, list(zip(seqs, prompts)), temps)
assert all(torch.equal(a, b) for a, b in zip(trained, rolled)), [(a - b).abs().max() for a, b in zip(trained, rolled)]
assert not all(torch.equal(a, b) for a, b in zip(own, rolled)), "control: our own attention must miss SGLang's bits"
print("model ok", sum(len(t) for t in trained))
""")
    assert proc.returncode == 0 and "model ok" in proc.stdout, proc.stderr[-4000:]
