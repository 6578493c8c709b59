"""The detent arm's default tuple for a model and the bench's decode limits, with every linear site's `tile_32` knob
set to a choice (a schedule knob: bit-neutral), written as a tuple file for `bench --commitment` (an A/B of the
default's M <= 32 tile against the tuner's batch-1 pick, choice 1 = 16 x 32)."""
import json
import sys

import torch

from detent_rl.kernels.commitment import CommitmentTuple
from detent_rl.models import load_model
from detent_rl.models.builtin import builtin_checkpoint

model_name, choice, out, device = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
m = load_model(builtin_checkpoint(model_name), "detent", device=device, dtype=torch.bfloat16, max_context=784,
               max_batch=256, max_num_tokens=8192)
path = m.selections.resolved().save(out)
data = json.loads(open(path).read())
for site, entry in data["sites"].items():
    if site.startswith("matmul[") and "tile_32" in entry["knobs"]:
        entry["knobs"]["tile_32"] = choice
open(path, "w").write(json.dumps(data, indent=1))
t = CommitmentTuple.load(path)
print(out, "sha", t.sha256()[:12], {s: e["knobs"].get("tile_32") for s, e in data["sites"].items() if s.startswith("matmul[")})
