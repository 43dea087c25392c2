"""Drafts alone (no finding checks) of a clinic's OraPO candidate and its GRPO twin, on the clinic story's own test studies."""
import json, shutil, sys
from pathlib import Path
sys.path.insert(0, "/work/main")
from benchmarks.bench_round_story import draw, outcome

seed, which = int(sys.argv[1]), sys.argv[2]
data = Path(f"/tmp/exp/po-clinic{seed}")
src = data / ("models/versions/round-1" if which == "orapo" else "grpo-from-round-1")
dst = Path(f"/tmp/exp/nocheck/{which}-{seed}")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
import os
if not os.environ.get("KEEP_CHECKS"):
    (dst / "finding_verifier.json").unlink()
else:
    which = which + "-checks"
base = data / "models/starter"
positives = draw(125, seed + 1, "pleural_other", True, 256)
negatives = draw(200, seed + 2, "pleural_other", False, 256)
r = outcome(str(base), str(dst), positives, negatives, "pleural_other", Path(f"/tmp/exp/nocheck/test-{which}-{seed}"))
print(which, seed, {k: r[k] for k in ("recall", "false_positive_rate", "macro_f1_14")})
Path(f"/tmp/exp/nocheck/{which}-{seed}.json").write_text(json.dumps(r, indent=1, default=str))
