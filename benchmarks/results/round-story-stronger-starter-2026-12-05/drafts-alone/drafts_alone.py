"""Drafts alone (no finding checks) of a clinic's OraPO candidate and its GRPO twin, on the clinic story's own test studies."""
import json, shutil, sys
from pathlib import Path
sys.path.insert(0, "/work/main")
from benchmarks.bench_round_story import draw, outcome

seed, which = int(sys.argv[1]), sys.argv[2]
FINDING = sys.argv[3] if len(sys.argv) > 3 else "pleural_other"
prefix = {"pleural_other": "po", "lung_lesion": "ll"}[FINDING]
data = Path(f"/tmp/exp/{prefix}-clinic{seed}")
src = data / ("models/versions/round-1" if which == "orapo" else "grpo-from-round-1")
dst = Path(f"/tmp/exp/nocheck/{prefix}-{which}-{seed}")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
import os
if not os.environ.get("KEEP_CHECKS"):
    (dst / "finding_verifier.json").unlink()
else:
    which = which + "-checks"
base = data / "models/starter"
positives = draw(125, seed + 1, FINDING, True, 256)
negatives = draw(200, seed + 2, FINDING, False, 256)
r = outcome(str(base), str(dst), positives, negatives, FINDING, Path(f"/tmp/exp/nocheck/test-{prefix}-{which}-{seed}"))
print(which, seed, {k: r[k] for k in ("recall", "false_positive_rate", "macro_f1_14")})
Path(f"/tmp/exp/nocheck/{prefix}-{which}-{seed}.json").write_text(json.dumps(r, indent=1, default=str))
