"""The detent arm's default tuple for a model and the bench's decode limits, with every linear site's `tile_32` knob
set to a choice, or ("rule") to 1 where wip/tile32-default's M <= 16 rule takes it and 0 elsewhere (a schedule knob:
bit-neutral), written as a tuple file for `bench --commitment` (an A/B of the default's M <= 32 tile against the
tuner's batch-1 pick, choice 1 = 16 x 32)."""
import json
import re
import sys

import torch

from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import builtin_checkpoint

model_name, choice, out, device = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 132


def rule_fires(n: int, k: int) -> bool:
    """The rule at M <= 16: the 16 x 64 tiles times the chunks number under two a multiprocessor."""
    tiles = (n + 63) // 64
    splits = max(1, min(NUM_SMS // tiles, k // 128)) if k > n else 1
    chunk = ((k + splits - 1) // splits + 127) // 128 * 128
    return n < 16384 and tiles * ((k + chunk - 1) // chunk) < 2 * NUM_SMS


m = load_model(builtin_checkpoint(model_name), "detent", device=device, dtype=torch.bfloat16, max_context=784,
               max_batch=256, max_num_tokens=8192)
path = m.selections.resolved().save(out)
data = json.loads(open(path).read())
for site, entry in data["sites"].items():
    if site.startswith("matmul[") and "tile_32" in entry["knobs"]:
        k, n = (int(v) for v in re.findall(r"[kn]=(\d+)", site))
        entry["knobs"]["tile_32"] = (1 if rule_fires(n, k) else 0) if choice == "rule" else int(choice)
open(path, "w").write(json.dumps(data, indent=1))
t = CommitmentTuple.load(path)
print(out, "sha", t.sha256()[:12], {s: e["knobs"].get("tile_32") for s, e in data["sites"].items() if s.startswith("matmul[")})
