"""The GPU probes' CPU-side logic: what they would time and what they refuse, checked without a GPU."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from bench_scripts import BENCH, load


def test_partition_probe_plans_every_legal_partition_with_forms_that_fit_it():
    """`bench/partition_probe.py`: the partitions are the selection program's legal ones (the default's among them,
    K whole too); each pinned partition's selection is what the probe calls `selected`; a grid form's K block always
    divides the chunk, the parallel forms appear only where K is cut, and a 16-row decode call gets the narrow tiles."""
    probe = load("partition_probe")
    dep = probe.deployment("0.5b", 132, 227 * 1024)
    legal = probe.partitions(dep, 896, 4864, "all")
    assert 640 in legal and 4864 in legal and legal == sorted(legal) and len(legal) >= 3
    assert probe.partitions(dep, 896, 4864, "2432,0") == [2432, 4864]
    with pytest.raises(SystemExit, match=r"--chunks \[1000\] not legal for n=896, k=4864; legal: \[640"):
        probe.partitions(dep, 896, 4864, "1000")
    # --explore: a cut the program does not reach (the o projection is never cut), timed in the grid only
    assert probe.legal_partitions(dep, 896, 896) == [896]
    assert probe.partitions(dep, 896, 896, "384,0", explore=True) == [384, 896]
    with pytest.raises(SystemExit, match=r"\[1000\] not legal for n=896, k=896; multiples of 128 up to 896"):
        probe.partitions(dep, 896, 896, "1000", explore=True)
    for chunk in legal:
        selected = probe.selector(dep, 896, 4864, chunk)
        assert {selected(m).chunk for m in (1, 256, 8192)} == {chunk}  # the pin holds at every M
        for m in (1, 64, 256, 2048):
            forms = probe.grid(m, 896, 4864, chunk, 132, wgmma=True)
            assert forms, (chunk, m)
            for name, kw in forms:
                assert chunk % kw["block_k"] == 0, (chunk, m, name)
                assert not kw["parallel"] or chunk < 4864, (chunk, m, name)
    narrow = {name for name, _ in probe.grid(1, 896, 4864, 2432, 132, wgmma=False)}
    assert {"P16x16x128w4s8", "S16x16x128w4s8", "P16x32x128w4s8"} <= narrow
    assert not any("x256w" in n or "x512w" in n for n in narrow)  # 2,432 is 19 blocks of 128: no 256-element blocks
    assert all(not kw["parallel"] for _, kw in probe.grid(8, 896, 4864, 4864, 132, wgmma=True))  # K whole
    assert not any(kw.get("wgmma") for _, kw in probe.grid(8192, 896, 4864, 640, 132, wgmma=False))


def test_partition_probe_plan_runs_without_a_gpu_and_refuses_bad_arguments(capsys):
    plan = subprocess.run([sys.executable, "-P", str(BENCH / "partition_probe.py"), "--plan", "--models", "1.5b",
                           "--ms", "1,2048"], capture_output=True, text=True)  # the script as the device runs it
    assert plan.returncode == 0, plan.stderr
    lines = [line for line in plan.stdout.splitlines() if line.startswith("1.5b down 8960->1536 chunk")]
    assert len(lines) >= 3 and any("chunk 1792 (5): 1: P16x32x128" in line for line in lines)
    assert any("chunk 8960 (1): 1: S" in line for line in lines)
    probe = load("partition_probe")
    probe.main(["--plan", "--models", "1.5b", "--sites", "o", "--chunks", "768", "--explore", "--ms", "1"])
    assert "1.5b o 1536->1536 chunk 768 (2): 1: not selectable +" in capsys.readouterr().out
    refused = [(["--plan", "--sites", "nope"], "--sites ['nope'] unknown"), (["--plan", "--models", "7b"], "'7b'"),
               (["--plan", "--resume", "nope.json"], "--resume nope.json: not an earlier run's --json rows")]
    if not torch.cuda.is_available():
        refused.append((["--models", "0.5b"], "no CUDA device; --plan prints the plan without one"))
    for argv, message in refused:
        with pytest.raises(SystemExit, match=re.escape(message)):
            probe.main(argv)


def test_partition_probe_runs_every_step_on_the_cpu_and_resumes(tmp_path, capsys):
    """`--cpu` runs the probe's whole path (selection, grid, bits against one big call, cuBLAS's control, summary,
    --json and --resume) with `linear`'s CPU path for every form: a Python error here would otherwise cost a device
    call. Every form keeps the big call's rows; the figures mean nothing and the output says so."""
    probe = load("partition_probe")
    rows = tmp_path / "rows.json"
    probe.main(["--cpu", "--models", "0.5b", "--sites", "down", "--ms", "1,3", "--chunks", "640,0", "--json",
                str(rows)])
    out = capsys.readouterr().out
    assert "CPU (--cpu: the script's logic, not figures)" in out
    for chunk, selected in ((640, "P16x32x128"), (4864, "S16x32x128")):  # the M <= 16 rule's narrow tile
        for m in (1, 3):
            assert f"| 0.5b | down | {chunk} | {m} |" in out and f" {selected} (" in out
    assert "| 0.5b | down | 640 (8) |" in out and "| 0.5b | down | 4864 (1) |" in out and "DIFF" not in out
    assert " / nanx / nanx | " in out  # no row in the middle or at the large end: nothing claimed there
    done = json.loads(rows.read_text())
    assert {(r["chunk"], r["m"]) for r in done} == {(640, 1), (640, 3), (4864, 1), (4864, 3)}
    assert all(r["bits"] and r["selected"] > 0 and r["best"] <= r["selected"] for r in done)
    probe.main(["--cpu", "--models", "0.5b", "--sites", "down", "--ms", "1,3,5", "--chunks", "640", "--resume",
                str(rows)])
    again = capsys.readouterr().out
    assert "| 0.5b | down | 640 | 5 |" in again and "| 0.5b | down | 640 | 1 |" not in again  # only M = 5 timed


def test_the_warp_specialized_probes_barrier_protocol_holds_and_its_check_sees_each_mutation(capsys):
    """`bench/ws_protocol_check.py`: the protocol of `bench/gemm_ws_probe.py`'s partitions (loader, warpgroups,
    mbarrier phases) neither deadlocks nor overwrites a slot in use, over random schedules; each mutation of it is
    reported (the check's control)."""
    check = load("ws_protocol_check")
    check.main(["--seeds", "1"])
    assert ", 0 failed (mutation: none)" in capsys.readouterr().out
    for mutation in ("no-fold-release", "short-count", "long-lag"):
        check.main(["--seeds", "1", "--mutation", mutation])  # (exits if the mutation went unseen)
        out = capsys.readouterr().out
        assert " 0 failed" not in out and f"(mutation: {mutation})" in out


def test_the_gpu_probes_site_setup_and_baseline_on_the_cpu():
    """`site_operands` and `baseline`, which the warp-specialized and fold probes run per case and M on the GPU:
    on the CPU the selection's rows equal the partition's reference (one big call's first rows), K whole's rows
    differ from them (the probes' control), and the timer sees both cuBLAS's thunk and the selection's."""
    probe = load("partition_probe")
    dep = probe.deployment("0.5b", 132, 227 * 1024)
    g = torch.Generator().manual_seed(0)
    select, w0, w, b, big, ref_all, whole_all = probe.site_operands(dep, 896, 4864, False, 640, 48, g, "cpu")
    assert w() is w0 and b is None and big.shape == (48, 4864) and ref_all.shape == (48, 896)
    assert not torch.equal(whole_all, ref_all)
    timed = []
    for m in (1, 17, 48):
        cublas, chosen, selected, same = probe.baseline(big[:m], w0, w, b, select, ref_all[:m],
                                                        lambda fn: timed.append(fn()) or 1.0)
        assert same and chosen["chunk"] == 640 and cublas == selected == 1.0
    assert [t.shape[0] for t in timed] == [1, 1, 17, 17, 48, 48]


def test_launch_ablation_probe_leaves_each_family_out_and_puts_it_back(monkeypatch):
    """`bench/launch_ablation_probe.py`: a variant's decode steps call none of its families' kernels and the others'
    as before (control: the plain variant calls all three), and the kernels are restored after each variant."""
    from collections import Counter

    from detent_rl.kernels import matmul
    from detent_rl.models import layers, load_model
    from detent_rl.models.builtin import builtin_checkpoint
    probe = load("launch_ablation_probe")
    assert [name for name, _ in probe.variants("norm,all")] == ["plain", "norm", "all"]
    with pytest.raises(SystemExit, match="'nope' is not one of norm, silu, rotary, reduce, all"):
        probe.variants("norm,nope")
    calls = Counter()
    names = {"norm": "rmsnorm_autograd", "silu": "silu_and_mul_autograd", "rotary": "rotary_store_autograd"}
    for family, name in names.items():
        real = getattr(layers, name)
        monkeypatch.setattr(layers, name, lambda *a, _f=family, _real=real, **k: calls.update([_f]) or _real(*a, **k))
    held = {name: getattr(layers, name) for name in names.values()} | {"reduce": matmul.combine_splits}
    model = load_model(builtin_checkpoint("tiny"), "detent", device="cpu", dtype=torch.float32, max_context=64,
                       max_batch=4, max_num_tokens=256)
    probe.finite_logits(model)
    for families in ((), ("norm",), ("silu", "rotary"), probe.FAMILIES):
        calls.clear()
        assert probe.step_ms(model, 1, 8, 3, families) > 0
        assert all(calls[f] == 0 for f in families) and all(calls[f] > 0 for f in names if f not in families), \
            (families, calls)
        assert {name: getattr(layers, name) for name in names.values()} | {"reduce": matmul.combine_splits} == held


def test_decode_profile_counts_idle_time_where_no_kernel_span_is_open():
    """`bench/decode_profile.py`'s gaps: under PDL spans overlap, and a span that opens later may close first;
    the device is idle only where no span is open (the union's complement), and busy for the union."""
    from types import SimpleNamespace
    mod = load("decode_profile")
    cuda = torch.autograd.DeviceType.CUDA

    def ev(name, start, end):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_time=end - start,
                               device_type=cuda)
    # a long kernel with a short one inside it (PDL: resident early, done first), then a kernel 5 µs after the
    # long one ends, then the host's 50 µs before the next step's first kernel
    events = [ev("long", 0, 100), ev("short", 10, 20), ev("next", 105, 130), ev("step2", 180, 190)]
    gaps = mod._gaps(SimpleNamespace(events=lambda: events), steps=1)
    assert gaps["busy_us"] == 100 + 25 + 10
    assert gaps["in_graph_us"] == 5 and gaps["pairs"] == [("long -> next", 5)]  # not 85 after "short"
    assert gaps["host_us"] == 50


def test_decode_profile_by_slot_parts_a_kernels_launches_by_their_place_in_the_layer():
    """`--by-slot`: two steps of a two-layer model, four linears a layer and the LM head after them, two norms a
    layer and the last one, a once-a-step kernel and one whose count does not divide by the steps (one row)."""
    from types import SimpleNamespace
    mod = load("decode_profile")
    cuda = torch.autograd.DeviceType.CUDA
    events, t = [], 0.0

    def launch(name, us):
        nonlocal t
        events.append(SimpleNamespace(name=name, time_range=SimpleNamespace(start=t, end=t + us), device_time=us,
                                      device_type=cuda))
        t += us + 1

    for _ in range(2):
        launch("_embedding_kernel", 1.0)
        for _ in range(2):
            launch("_rmsnorm_kernel", 2.0)
            launch("_matmul_kernel", 3.0)  # qkv
            launch("_matmul_kernel", 4.0)  # o
            launch("_rmsnorm_kernel", 2.5)
            launch("_matmul_kernel", 10.0)  # gate_up
            launch("_matmul_kernel", 6.0)  # down
        launch("_rmsnorm_kernel", 2.0)
        launch("_matmul_kernel", 50.0)  # the LM head
    launch("odd", 1.0)
    slots = mod._per_slot(SimpleNamespace(events=lambda: events), steps=2, layers=2)
    mm = {k: v for k, v in slots.items() if k.startswith("_matmul_kernel")}
    assert mm == {"_matmul_kernel [1 of 4 a layer]": (2, 6.0), "_matmul_kernel [2 of 4 a layer]": (2, 8.0),
                  "_matmul_kernel [3 of 4 a layer]": (2, 20.0), "_matmul_kernel [4 of 4 a layer]": (2, 12.0),
                  "_matmul_kernel [after the layers, 1]": (1, 50.0)}
    assert slots["_rmsnorm_kernel [2 of 2 a layer]"] == (2, 5.0)
    assert slots["_rmsnorm_kernel [after the layers, 1]"] == (1, 2.0)
    assert slots["_embedding_kernel"] == (1, 1.0) and slots["odd"] == (0.5, 0.5)
    # the control: the plain per-kernel table has one row a kernel, the same totals
    _, kernels, _ = mod._per_kernel(SimpleNamespace(events=lambda: events), 2)
    assert kernels["_matmul_kernel"] == (9, 96.0)
    assert sum(us for _, us in mm.values()) == kernels["_matmul_kernel"][1]


def test_order_probe_runs_its_five_runs_and_sees_an_engine_left_in_a_cycle(capsys):
    """`bench/order_probe.py`: stock, the other arm, stock, the other arm, then stock after a collection, each through
    the bench's own `run`; its census finds an engine that only a collection would free (control: none after it)."""
    import gc

    from detent_rl.models import load_model
    from detent_rl.models.builtin import builtin_checkpoint
    from detent_rl.rollout.engine import Engine
    probe = load("order_probe")
    probe.main(["--model", "tiny", "--quick", "--device", "cpu"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if re.match(r"\| \d ", line)]
    assert [(r[1].strip(), r[2].strip()) for r in rows] == [("stock", "no"), ("detent", "no"), ("stock", "no"),
                                                            ("detent", "no"), ("stock", "yes")]
    assert all(float(r[3]) > 0 for r in rows)
    gc.collect()
    before = probe.alive()["engines"]
    model = load_model(builtin_checkpoint("tiny"), "detent", device="cpu", dtype=torch.float32, max_context=64,
                       max_batch=4, max_num_tokens=256)
    engine = Engine.for_requests(model, 2, 32, 2)
    engine.cycle = engine  # only the collector frees it now
    del engine
    assert probe.alive()["engines"] == before + 1
    gc.collect()
    assert probe.alive()["engines"] == before
