"""detent_rl's SGLang plugin against SGLang's own package, on the CPU (skipped without SGLang; .ci/run
installs it, see tests/sglang_env.py). SGLang's Triton kernels run under the interpreter in a
subprocess (TRITON_INTERPRET is read at import): logic and bits of that CPU run, not GPU bits."""
from __future__ import annotations

import importlib.metadata
import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from interpreted import run_interpreted
from sglang_decode_cases import backend_fields
from sglang_env import PRELUDE, fresh_sglang, import_sglang, plugin_reset  # noqa: F401 (a fixture)

sglang = import_sglang()

import sglang.srt.plugins as sgl_plugins  # noqa: E402
import triton  # noqa: E402
from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as F  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from detent_rl.kernels.commitment import CommitmentTuple  # noqa: E402
from detent_rl.kernels.programs.sglang import moe_config as MOE  # noqa: E402
from detent_rl.rollout import sglang_plugin as P  # noqa: E402

ENTRY = "detent_rl.rollout.sglang_plugin:register"
plugin_reset()  # records the hooked attributes before any test applies a hook


def test_sglang_loads_the_plugin_from_its_entry_point(fresh_sglang, monkeypatch):
    eps = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins") if ep.value == ENTRY]
    assert eps, "no sglang.srt.plugins entry point for the plugin (pip install -e . registers it)"
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")  # control: SGLang skips a plugin it is not told to load
    sgl_plugins.load_plugins()
    assert not P.applied()
    sgl_plugins._plugins_loaded = False
    monkeypatch.setenv("SGLANG_PLUGINS", eps[0].name)
    sgl_plugins.load_plugins()
    assert P.applied()
    with pytest.raises(ValueError, match="sampling_seed"):  # the sampling hook went in with it
        SamplingParams(max_new_tokens=4, temperature=1.0).verify(vocab_size=100)
    # the FA3 pin is registered too (its module imports only where its kernels do)
    assert f"{P.FA3_BACKEND}.__init__" in HookRegistry._hooks


def _init_assigns(target: str) -> set[str]:
    """The `self.<name>` attributes a class's __init__ assigns, read from SGLang's source (the module is
    not imported: FA3's needs sgl_kernel)."""
    import ast
    import importlib.util
    module, cls = target.rsplit(".", 1)
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    init = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return {t.attr for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def test_fa3_keeps_one_split_and_fa4_is_refused():
    """The fields the hook sets are the ones SGLang's own __init__ assigns (read from its source, so a
    renamed field in another version fails here); FA3 keeps one split; FA4, which the same class runs,
    is refused (its deterministic mode needs more than the split count)."""
    fields = P.FA3_SPLIT_FIELDS[P.check_version()]
    assert {*fields, "fa_impl_ver"} <= _init_assigns(P.FA3_BACKEND)
    be = SimpleNamespace(**{f: 0 for f in fields}, fa_impl_ver=3)  # SGLang's defaults, not deterministic
    P.pin_fa3_backend(None, be)
    assert [getattr(be, f) for f in fields] == [1] * len(fields)
    with pytest.raises(P.SGLangPluginError, match="runs FlashAttention 4"):
        P.pin_fa3_backend(None, SimpleNamespace(num_splits=0, decode_num_splits=0, fa_impl_ver=4))


def test_flashinfer_is_built_on_sglangs_deterministic_path_with_one_split(fresh_sglang, monkeypatch, tmp_path):
    """The hook runs FlashInferAttnBackend.__init__ with SGLang's deterministic flag in force and its
    split-tile variables at the context length (what that __init__ reads: its own source assigns the
    fields from the flag and names the variables, so a renamed one in another version fails here),
    inside SGLang's real runtime context; after it, even when __init__ raises, flag and variables are
    as they were. Control: the same __init__ stand-in run unhooked sees the flag off and no tiles."""
    import importlib.util

    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.runtime_context import get_context, get_exec, reset_context
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.common import get_int_env_var
    assert {"enable_deterministic", "decode_use_tensor_cores", "prefill_split_tile_size", "decode_split_tile_size",
            "disable_cuda_graph_kv_split"} <= _init_assigns(P.FLASHINFER_BACKEND)
    source = Path(importlib.util.find_spec(P.FLASHINFER_BACKEND.rsplit(".", 1)[0]).origin).read_text()
    assert all(f'"{name}"' in source for name in P.FLASHINFER_TILES)
    monkeypatch.delenv(P.FLASHINFER_TILES[0], raising=False)
    monkeypatch.setenv(P.FLASHINFER_TILES[1], "2048")  # a user's own value, put back after
    seen = []

    def init(backend, runner):  # what SGLang's __init__ reads, recorded
        seen.append((get_exec().deterministic.enable_deterministic_inference,
                     [get_int_env_var(n, -1) for n in P.FLASHINFER_TILES]))
    runner = SimpleNamespace(model_config=SimpleNamespace(context_len=40960))
    # a model config on disk: 0.5.17's ServerArgs reads it while it resolves its defaults
    from transformers import Qwen2Config
    Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, architectures=["Qwen2ForCausalLM"]).save_pretrained(tmp_path)
    get_context().set_server_args(ServerArgs(model_path=str(tmp_path), device="cpu"))
    try:
        init(None, runner)
        P.pin_flashinfer_backend(init, None, runner)
        assert seen == [(False, [-1, 2048]), (True, [40960, 40960])], seen
        pristine = FlashInferAttnBackend.__init__
        P.register()
        HookRegistry.apply_hooks()
        assert FlashInferAttnBackend.__init__ is not pristine
        with pytest.raises(AttributeError):  # SGLang's own __init__, hooked, on a runner without its pools
            FlashInferAttnBackend(runner)
        assert not get_exec().deterministic.enable_deterministic_inference
    finally:
        reset_context()
    assert P.FLASHINFER_TILES[0] not in os.environ and os.environ[P.FLASHINFER_TILES[1]] == "2048"


def test_the_split_tile_comes_from_the_commitment_tuple(tmp_path, monkeypatch):
    monkeypatch.delenv(P.ENV_COMMITMENT, raising=False)
    assert P.split_tile_size() == 256  # the program's default
    path = CommitmentTuple({P.SITE: {"knobs": {"split_tile_size": 512}}}).save(tmp_path / "t.json")
    assert P.split_tile_size(path) == 512
    monkeypatch.setenv(P.ENV_COMMITMENT, str(path))
    assert P.split_tile_size() == 512
    bad = CommitmentTuple({P.SITE: {"knobs": {"split_tile_size": 300}}}).save(tmp_path / "bad.json")
    with pytest.raises(P.SGLangPluginError,
                       match=r"bad\.json: sites\.sglang\.triton_decode\.knobs\.split_tile_size is 300"):
        P.split_tile_size(bad)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(P.SGLangPluginError, match="broken.json"):
        P.split_tile_size(tmp_path / "broken.json")


def test_the_pinned_backend_takes_its_splits_from_the_committed_selector(fresh_sglang):
    """After __init__ the hook sizes the split buffers from the selector; each request's count is the
    selector's, computed for the batch at once, and no neighbour moves it."""
    P._STATE["tile"] = 512
    be = backend_fields()
    P.pin_backend(None, be)
    assert (be.split_tile_size, be.max_kv_splits, be.static_kv_splits) == (512, 80, False)
    assert be.enable_lean_attention is False  # SGLang's work-stealing decode (ROCm) never runs pinned
    assert be.enable_deterministic is True  # the backend's unified extend kernel for prefill
    rng = random.Random(0)
    target = 3000
    seen = set()
    for n in (1, 2, 7, 64, 300):
        lens = [rng.randint(1, 40960) for _ in range(n - 1)] + [target]
        out = torch.empty(n, dtype=torch.int32)
        P.pinned_num_kv_splits(be, out, torch.tensor(lens))
        want = [be.detent_selector(seq_len=L, max_seq_len=max(lens), min_seq_len=min(lens), num_seq=n).num_kv_splits
                for L in lens]
        assert out.tolist() == want
        seen.add(out[-1].item())
    assert seen == {6}  # ceil(3000 / 512), alone or among 300
    out = torch.empty(6, dtype=torch.int32)  # speculative decoding: two drafts share each sequence
    P.pinned_num_kv_splits(be, out, torch.tensor([600, 1, 5000]))
    assert out.tolist() == [2, 2, 1, 1, 10, 10]


def test_transcription_equals_sglang_and_the_pins_hold_where_sglang_reads_the_batch():
    """SGLang's own get_num_kv_splits (its Triton kernel, interpreted) equals the SelIR transcription on
    random batches, on its heuristic, deterministic and static paths; on the heuristic path a request's
    count moves with its neighbours (the negative control), under the plugin it never does."""
    proc = run_interpreted(PRELUDE + """
import random
from types import SimpleNamespace
import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from detent_rl.kernels.programs.sglang import triton_decode as TD
from detent_rl.rollout import sglang_plugin as P
from sglang_decode_cases import backend_fields
facts = {**TD.REFERENCE_FACTS, "max_num_seq": 512}  # batches past 256: SGLang schedules them in a wider block
rng = random.Random(1)
stock_counts, pinned_counts, checked = set(), set(), 0
pinned = backend_fields()
P._STATE["tile"] = 256
P.pin_backend(None, pinned)
for trial in range(24):
    n = rng.choice([1, 2, 3, 8, 64, 255, 256, 300])
    lo = rng.choice([1, 1000, 30000])
    lens = [rng.randint(lo, 40960) for _ in range(n - 1)] + [5000]
    for path, be in (("heuristic", backend_fields()),
                     ("deterministic", backend_fields(enable_deterministic=True, split_tile_size=256,
                                                      max_kv_splits=160)),
                     ("static", backend_fields(static_kv_splits=True))):
        out = torch.zeros(n, dtype=torch.int32)
        TritonAttnBackend.get_num_kv_splits(be, out, torch.tensor(lens, dtype=torch.int32))
        kw = {**facts, "enable_deterministic": path == "deterministic", "static_kv_splits_env": path == "static"}
        want = [TD.triton_decode_num_kv_splits(seq_len=L, max_seq_len=max(lens), min_seq_len=min(lens), num_seq=n,
                                               **kw)["num_kv_splits"] for L in lens]
        assert out.tolist() == want, (path, lens, out.tolist(), want)
        checked += n
        if path == "heuristic":
            stock_counts.add(out[-1].item())
    out = torch.zeros(n, dtype=torch.int32)
    P.pinned_num_kv_splits(pinned, out, torch.tensor(lens, dtype=torch.int32))
    pinned_counts.add(out[-1].item())
assert len(stock_counts) > 1, f"control: SGLang's own count for one 5,000-token request should move with the batch"
assert pinned_counts == {20}, pinned_counts
print("splits ok", checked, sorted(stock_counts))
""")
    assert proc.returncode == 0 and "splits ok" in proc.stdout, proc.stderr[-3000:]


def test_sglang_decode_attention_keeps_a_requests_bits_under_the_plugin():
    """SGLang's own Triton decode attention (interpreted, fp32): one request's output row alone and at
    row 3 of a batch of 8 similar lengths — different bits under SGLang's split selection (it splits the
    request's keys fewer ways among neighbours), equal bits under the plugin's. The helpers are the GPU
    test's (tests/sglang_decode_cases.py), so this also checks them."""
    proc = run_interpreted(PRELUDE + """
import random
import torch
from sglang_decode_cases import Batch, backend
H, KVH, D, CTX = 4, 2, 32, 4096
rng = random.Random(0)
lens = [rng.randint(900, 1000) for _ in range(8)]  # a GRPO-like batch of similar lengths
lens[3] = 1000  # the request under test, at row 3
batch = Batch(lens, num_head=H, num_kv_head=KVH, dim=D, dtype=torch.float32, device="cpu")
# 16 SMs: SGLang's heuristic then splits one 1,000-token request 8 ways alone and fewer in a batch of 8
stock = backend("stock", num_head=H, num_kv_head=KVH, context=CTX, sms=16)
pinned = backend("detent", num_head=H, num_kv_head=KVH, context=CTX, sms=16, tile=256)
alone, s_alone = batch.row(3, [3], *stock)
inside, s_batch = batch.row(3, list(range(8)), *stock)
k, v = (x[batch.tokens[3]].repeat_interleave(H // KVH, 1) for x in (batch.k, batch.v))
ref = torch.einsum("ht,thd->hd", torch.softmax(torch.einsum("hd,thd->ht", batch.q[3], k) * D ** -0.5, -1), v)
assert (alone - ref).abs().max() < 1e-4 and (inside - ref).abs().max() < 1e-4
assert s_alone != s_batch and not torch.equal(alone, inside), \\
    f"control: SGLang's selection should split the request {s_alone} vs {s_batch} ways and change its bits"
p_alone, n1 = batch.row(3, [3], *pinned)
p_inside, n2 = batch.row(3, list(range(8)), *pinned)
assert n1 == n2 == 4 and torch.equal(p_alone, p_inside)
print("attention ok", s_alone, s_batch)
""")
    assert proc.returncode == 0 and "attention ok" in proc.stdout, proc.stderr[-3000:]


def test_the_benchmarks_extend_and_moe_cases_run_sglangs_kernels_as_sglang_does():
    """The H200 benchmark's helpers (tests/sglang_kernel_cases.py), interpreted in fp32. Extend: both
    arms' rows equal causal attention; alone = in a batch under either; a prompt in two chunks (half
    cached) changes its bits under the two-stage stock kernel (the control) and not under the one-stage
    one. Fused MoE: SGLang's kernel through our expert alignment equals the per-token reference (an
    alignment that mixed tokens or experts would not), and the arms' configs are SGLang's — the row
    nearest M (stock), the deterministic default, one row for every M (the plugin)."""
    proc = run_interpreted(PRELUDE + """
import torch
from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as F
from sglang_kernel_cases import EXTEND_ARMS, Prompts, moe_config, moe_up
p = Prompts([40, 24, 33], num_head=4, num_kv_head=2, dim=16, dtype=torch.float32, device="cpu")
k, v = (x[:40].repeat_interleave(2, 1).transpose(0, 1) for x in (p.k, p.v))
ref = torch.nn.functional.scaled_dot_product_attention(p.q[:40].transpose(0, 1), k, v, is_causal=True).transpose(0, 1)
same = {}
for arm in EXTEND_ARMS:
    whole = p.rows(arm, 0, [[(0, 0, 40)]])
    assert (whole - ref).abs().max() < 1e-5, arm
    assert torch.equal(whole, p.rows(arm, 0, [[(0, 0, 40), (1, 0, 24), (2, 0, 33)]])), arm
    same[arm] = torch.equal(whole, p.rows(arm, 0, [[(0, 0, 17)], [(0, 17, 23), (1, 0, 24), (2, 0, 33)]]))
assert same == {"stock": False, "unified": True}, same
g = torch.Generator().manual_seed(0)
w1, x = torch.randn(8, 32, 32, generator=g), torch.randn(10, 32, generator=g)
ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(10)]).to(torch.int32)
run, out = moe_up(x, w1, ids, torch.rand(10, 2, generator=g),
                  {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1})
run()
want = torch.stack([torch.stack([x[t] @ w1[ids[t, j]].T for j in range(2)]) for t in range(10)])
assert (out - want).abs().max() < 1e-4, (out - want).abs().max()
F.get_device_name = lambda: "NVIDIA H200"
shapes = ((128, 1536, 2048), (128, 2048, 768), 8)
cfg = {(arm, m): moe_config(arm, *shapes, m) for arm in ("stock", "deterministic", "detent") for m in (1, 512)}
assert cfg["stock", 1] != cfg["stock", 512], "control: SGLang's table gives 1 and 512 tokens other rows"
assert cfg["deterministic", 1] == cfg["deterministic", 512] and cfg["detent", 1] == cfg["detent", 512]
print("cases ok")
""")
    assert proc.returncode == 0 and "cases ok" in proc.stdout, proc.stderr[-3000:]


def test_requests_need_their_own_seed(fresh_sglang):
    """Seedless (and min-p) requests are refused once the hooks are applied, not before (the control);
    a batch carries each request's own seed, so SGLang's sampler takes its seeded path. (That sampler
    hashes seed, position and column; on a CPU it needs sgl_kernel's CPU op, so its draws are the GPU
    run's to compare.)"""
    SamplingParams(max_new_tokens=4, temperature=1.0).verify(vocab_size=100)  # stock SGLang takes it
    P.register()
    HookRegistry.apply_hooks()
    with pytest.raises(ValueError, match="sampling_seed"):
        SamplingParams(max_new_tokens=4, temperature=1.0).verify(vocab_size=100)
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(max_new_tokens=4, temperature=1.0, min_p=0.1, sampling_seed=1).verify(vocab_size=100)
    SamplingParams(max_new_tokens=4, temperature=1.0, sampling_seed=7).verify(vocab_size=100)

    reqs = [SimpleNamespace(rid=f"r{i}", sampling_params=SimpleNamespace(sampling_seed=s))
            for i, s in enumerate((5, 9))]
    info = P.seeded_batch(SimpleNamespace(device="cpu", sampling_seed=None), SamplingBatchInfo,
                          SimpleNamespace(reqs=reqs))
    assert info.sampling_seed.tolist() == [5, 9]
    reqs[1].sampling_params.sampling_seed = None
    with pytest.raises(ValueError, match=r"\['r1'\]"):
        P.seeded_batch(SimpleNamespace(device="cpu", sampling_seed=None), SamplingBatchInfo, SimpleNamespace(reqs=reqs))


def _moe_configs(device, version, ms):
    """SGLang's (up, down) MoE configs for Qwen3-30B-A3B's experts (E 128, N 768, top-8, bf16) at each M."""
    F.get_moe_configs.cache_clear()
    out = [F.try_get_optimal_moe_config((128, 1536, 2048), (128, 2048, 768), 8, None, m, return_down_config=True)
           for m in ms]
    F.get_moe_configs.cache_clear()
    return [(up, down) for up, (down, _) in out]


@pytest.mark.skipif(importlib.metadata.version("sglang") not in P.TRANSCRIBED_FOR["fused_moe"],
                    reason="this SGLang's MoE config is not transcribed: the plugin refuses it "
                           "(tests/test_sglang_releases.py)")
@pytest.mark.parametrize("device,version,pin", [("NVIDIA H100 80GB HBM3", "3.7.1", "table_key"),
                                                ("NVIDIA H200", "3.6.0", "table_key"),
                                                ("NVIDIA A10", "3.6.0", "small_m")])
def test_the_moe_config_row_is_pinned_in_sglangs_own_lookup(fresh_sglang, monkeypatch, tmp_path, device, version, pin):
    """SGLang's try_get_optimal_moe_config, hooked: one config for every token count, the committed one
    (the solver's default, or the tuple's pin); unhooked it follows M (the control). A pin the program
    does not allow is refused, naming the tuple's site."""
    monkeypatch.setattr(F, "get_device_name", lambda: device)
    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setattr(F, "get_exec", lambda: SimpleNamespace(
        deterministic=SimpleNamespace(enable_deterministic_inference=False)))
    monkeypatch.delenv(P.ENV_COMMITMENT, raising=False)
    ms = [1, 5, 16, 100, 128, 129, 700, 3000, 8192]
    stock = _moe_configs(device, version, ms)
    assert len({str(c) for c in stock}) > 1, "control: SGLang's MoE config follows the token count"
    P.register()
    HookRegistry.apply_hooks()
    pinned = _moe_configs(device, version, ms)
    assert len({str(c) for c in pinned}) == 1
    facts = dict(P.moe_facts((128, 2048, 768), None, False, None, False))
    assert facts["tuned_config_shipped"] == (pin == "table_key")
    want = MOE.fused_moe_config(M=P.moe_token_count(tuple(sorted(facts.items()))), **facts)
    up, down = pinned[0]
    assert {k: v for k, v in up.items() if k != "USE_TMA"} == {
        k.split(".", 1)[1]: v for k, v in want.items()
        if k.startswith("up.") and k != "up.USE_TMA" and (v or k not in ("up.num_warps", "up.num_stages"))}
    if pin == "table_key":  # the tuple's pin: row 64 of the table, for every M
        path = CommitmentTuple({P.MOE_SITE: {"pins": {"table_key": 64}}}).save(tmp_path / "t.json")
        P.register(path)
        hooked = _moe_configs(device, version, ms)
        with monkeypatch.context() as unhooked:
            unhooked.setattr(F, "try_get_optimal_moe_config", F.try_get_optimal_moe_config.__wrapped__)
            assert hooked == _moe_configs(device, version, [64]) * len(ms) != stock
        bad = CommitmentTuple({P.MOE_SITE: {"pins": {"table_key": 65}}}).save(tmp_path / "bad.json")
        P.register(bad)
        with pytest.raises(P.SGLangPluginError, match=r"bad\.json: sites\.sglang\.fused_moe"):
            P.moe_token_count(tuple(sorted(facts.items())))


def test_the_trainer_reproduces_an_sglang_rollout_interpreted():
    """SGLang's own kernels, interpreted (fp32): two sequences rolled out the way the pinned backend runs
    them — prompts prefilled in chunks by the unified extend kernel, completions decoded one token a
    step among other requests — and then recomputed by the trainer in one pass
    (`rollout_attention`): every row equal. Controls: the trainer's natural one-shot prefill (the
    extend kernel over whole sequences) misses the completion rows' bits, and SGLang's default
    two-stage extend kernel gives a chunked prompt other bits than a one-shot one (why the plugin
    takes the backend's unified path)."""
    proc = run_interpreted(PRELUDE + """
import torch
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd, extend_attention_fwd_unified
from sglang_decode_cases import sglang_rollout_rows
from detent_rl.rollout.sglang_attention import rollout_attention
g = torch.Generator().manual_seed(0)
H, KVH, D, TILE, CTX = 4, 2, 16, 64, 256
cu, prompts = [0, 110, 170], [30, 17]  # decode rows of up to 110 keys: one and two splits
T = cu[-1]
q, k, v = (torch.randn(T, h, D, generator=g) for h in (H, KVH, KVH))
rolled = sglang_rollout_rows(q, k, v, cu, prompts, tile=TILE, context=CTX)
trained = rollout_attention(q, k, v, cu, prompts, tile=TILE, context=CTX, scale=D ** -0.5, rows_per_call=23)
assert not torch.isnan(rolled).any() and torch.equal(trained, rolled), (trained - rolled).abs().max()
i32 = dict(dtype=torch.int32)
one_shot = torch.empty_like(q)
extend_attention_fwd_unified(q, one_shot, k, v, 1.0, 1.0, torch.tensor(cu, **i32), torch.tensor(cu, **i32),
                             torch.arange(T, **i32), torch.zeros(2, **i32), 110, sm_scale=D ** -0.5, is_causal=True)
completion = torch.cat([torch.arange(a + p, b) for a, b, p in zip(cu, cu[1:], prompts)])
assert not torch.equal(one_shot[completion], rolled[completion]), "control: a one-shot prefill must differ"

def two_stage(lo, hi):  # rows lo..hi-1 of sequence 0, keys 0..lo-1 cached
    o = torch.empty(hi - lo, H, D)
    extend_attention_fwd(q[lo:hi].contiguous(), k[lo:hi].contiguous(), v[lo:hi].contiguous(), o, k, v,
                         torch.tensor([0, hi - lo], **i32), torch.tensor([0, lo], **i32), torch.arange(lo, **i32),
                         None, True, None, hi - lo, 1.0, 1.0, sm_scale=D ** -0.5)
    return o
assert not torch.equal(two_stage(0, 60), torch.cat([two_stage(0, 23), two_stage(23, 60)])), \
    "control: SGLang's two-stage extend kernel should move a chunked row's bits"
print("rollout ok")
""")
    assert proc.returncode == 0 and "rollout ok" in proc.stdout, proc.stderr[-3000:]
