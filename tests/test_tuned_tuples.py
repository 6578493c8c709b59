"""The committed tuned tuples (bench/tuned/): each loads onto its built-in model at its own deployment and no
other, and the H200 recipe that names one is accepted by the run's check with it."""
from __future__ import annotations

import pytest

from detent_rl.config import RECIPES_DIR, load_recipe


def test_the_h200_grpo_recipe_takes_its_tuned_tuple(tmp_path):
    """recipes/grpo_qwen2-0.5b_h200.yaml's limits are its tuple's deployment, and the tuple's sites its model's:
    the run's check (the model built on "meta" with the tuple) accepts it."""
    import json

    from detent_rl.models.builtin import entry
    from detent_rl.setup import model_spec
    tuned = RECIPES_DIR.parent / "bench/tuned/h200_qwen2-0.5b_grpo32x8.json"
    r = load_recipe(RECIPES_DIR / "grpo_qwen2-0.5b_h200.yaml", [f"model.commitment={tuned}"])
    ckpt = tmp_path / "qwen2-0.5b"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(entry("qwen2-0.5b").config))  # the shapes; no weights needed
    spec = model_spec(r, ckpt, "cuda")
    assert (spec.max_context, spec.max_batch, spec.max_num_tokens) == (784, 256, 8192)
    spec.check()
    with pytest.raises(Exception, match="max_num_tokens"):  # the tuple pins this deployment only
        model_spec(load_recipe(RECIPES_DIR / "grpo_qwen2-0.5b_h200.yaml", [f"model.commitment={tuned}",
                                                                           "train.max_tokens_per_micro_batch=4096"]),
                   ckpt, "cuda").check()


@pytest.mark.parametrize("path", sorted((RECIPES_DIR.parent / "bench/tuned").glob("*.json")), ids=lambda p: p.stem)
def test_every_committed_tuple_loads_onto_its_model(tmp_path, path):
    """A tuple in bench/tuned/ (named <device>_<model>_<workload>.json: the GPU it was tuned on, h200 or h100) is
    taken by its built-in model at its own deployment (the model built on "meta": the sites and limits are checked,
    no weights); control: the other Qwen2 size refuses it (another deployment: its heads and widths)."""
    import json

    import torch

    from detent_rl.kernels.commitment import CommitmentTuple
    from detent_rl.models import load_model
    from detent_rl.models.builtin import entry

    name = path.name.split("_")[1]
    tuple_ = CommitmentTuple.load(path)
    limits = {k: tuple_.deployment[k] for k in ("max_context", "max_batch", "max_num_tokens")}

    def build(model: str):
        ckpt = tmp_path / model
        ckpt.mkdir(exist_ok=True)
        (ckpt / "config.json").write_text(json.dumps(entry(model).config))
        return load_model(ckpt, "detent", device="meta", dtype=torch.bfloat16, commitment=tuple_, **limits)

    build(name)
    others = {"qwen2-0.5b": "qwen2-1.5b", "qwen2-1.5b": "qwen2-0.5b"}
    assert name in others, f"{path.name}: name a built-in of another deployment for {name}'s control here"
    other = others[name]
    with pytest.raises(Exception, match="made for another deployment: num_heads"):
        build(other)
