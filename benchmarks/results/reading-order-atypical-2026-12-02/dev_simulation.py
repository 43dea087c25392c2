# Development-pool simulation (kept as the record of how the weight 0.6 was chosen): in memory, the product's own
# reading_order functions; pools drafted by /work/exp/devpool.py = bench_reading_order.draft_pool(seed 31 / 32, 1000).
import sys, pickle, argparse
sys.path.insert(0, "/work/main")
from collections import Counter
import numpy as np
from app.services import reading_order as ro
from app.services.dashboard import stated_findings
from benchmarks.bench_round_story import report_of
sys.path.insert(0, "/work/exp")
from dev_simulation_load import load, RARE

def simulate(ovs, by_id, variant, budget=300, seed=0):
    ro.WEIGHTS = (0.4, 0.3, 0.3, variant.get("w", 0.3))
    unread = {o.study.id: o for o in ovs}
    signed, read, curve = [], [], []
    shuffled = list(np.random.default_rng(seed).permutation(list(unread)))
    for step in range(budget):
        if variant["name"] == "random":
            sid = int(shuffled[step])
        else:
            stated = Counter(); missed = Counter()
            for d, t, truth, drafted in signed:
                stated.update(truth); missed.update(truth - drafted)
            rates = {f: missed[f] / (stated[f] + 2) for f in stated}
            like = ro.finding_resemblance(signed) if variant.get("image", True) else {}
            unusual = ro.image_atypicality(list(unread.values()), signed) if variant.get("w", 0.3) else {}
            sid = max(unread, key=lambda i: (ro.usefulness(unread[i], rates, like, unusual.get(i, 0.0)).score, -i))
        o = unread.pop(sid)
        t = report_of(by_id[sid])
        signed.append((o.latest_draft, t, stated_findings(t), stated_findings(o.latest_draft.text)))
        read.append(sid)
        if len(read) % 25 == 0:
            curve.append(sum(len({f.kind for f in by_id[s].findings} & set(RARE)) for s in read))
    return curve

if __name__ == "__main__":
    base = sys.argv[1]
    ovs, by_id = load(base)
    print("pool rare", {k: sum(any(f.kind == k for f in s.findings) for s in by_id.values()) for k in RARE}, flush=True)
    for v in [dict(name="random"), dict(name="useful-old", w=0.0), dict(name="w0.3", w=0.3), dict(name="w0.6", w=0.6)][int(sys.argv[2]) if len(sys.argv) > 2 else 0:]:
        print(v["name"], simulate(ovs, by_id, v), flush=True)
