"""Measured before ADD_MIN_PRECISION was chosen (2026-12-05): the additions' effect on the development films (seed
303) at the ablation's prevalence and at a clinic's (each finding's positives subsampled to 4 % of the rows and of
the films), with no floor and floors of 0.3 / 0.4 / 0.5, the cap at 20 % and the AUC bar at 0.7 as in rounds.
Kept as it was run (it reuses ../dev_readout.py's loading and drafting):

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/results/finding-check-2026-12-05/precision-floor/dev_floor.py \
        --model assets/starter --adapter RUN/runs/orapo_1000/seed0 --data RUN/data --json OUT
"""
import json, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
exec(open(Path(__file__).resolve().parents[1] / "dev_readout.py").read().split("from orapo_core.facts.ontology import CHEXPERT_14")[0].replace("a = p.parse_args()", "a = p.parse_args(sys.argv[1:])"))
from orapo_core.facts.ontology import CHEXPERT_14
from orapo_core.models.verifier import add_cut, _ridge, _auc
preds = res.predictions

def cut_with_floor(held, y, cap, floor):
    best = add_cut(held, y, cap)
    if best is None or floor is None:
        return best
    # the best-F1 cut among those with cap and cross-fitted precision >= floor
    negatives = np.sort(held[~y]); allowed = int(np.floor(cap * len(negatives)))
    lo = negatives[len(negatives) - allowed - 1] if allowed < len(negatives) else -np.inf
    out, bf = None, 0.0
    for c in np.unique(held[y & (held > lo)]):
        called = held >= c; tp = (called & y).sum()
        if tp / called.sum() < floor: continue
        f = 2 * tp / (called.sum() + y.sum())
        if f > bf: out, bf = float(c), f
    return out

def crossfit(X, y, seed=0, folds=5):
    mean, std = X.mean(0), X.std(0) + 1e-6; z = (X - mean) / std; t = np.where(y, 1.0, -1.0)
    order = np.random.default_rng(seed).permutation(len(y)); held = np.empty(len(y))
    for k in range(folds):
        te = order[k::folds]; fi = np.setdiff1d(order, te)
        w = _ridge(z[fi], t[fi], 1.0); held[te] = z[te] @ w[:-1] + w[-1]
    w = _ridge(z, t, 1.0)
    return held, (lambda Xn: ((Xn - mean) / std) @ w[:-1] + w[-1])

out = {}
for prev_name, keep_pos in (("ablation prevalence (~25 %)", None), ("clinic prevalence (4 %)", 0.04)):
    for floor in (None, 0.3, 0.4, 0.5):
        rows = {}
        for f in CHEXPERT_14:
            if f == "No Finding": continue
            yp = np.array([pos(r.labels, f) for r in pool]); yh = np.array([pos(pr["reference"], f) for pr in preds])
            d = np.array([pos(pr["labels"], f) for pr in preds])
            ip, ih = np.arange(len(yp)), np.arange(len(yh))
            if keep_pos is not None:  # keep positives at keep_pos of the rows (draw fixed by seed)
                rng = np.random.default_rng(1)
                def sub(y):
                    n_neg = (~y).sum(); n_keep = max(1, int(round(keep_pos * n_neg / (1 - keep_pos))))
                    pos_i = np.flatnonzero(y); keep = rng.choice(pos_i, min(n_keep, len(pos_i)), replace=False)
                    return np.sort(np.concatenate([np.flatnonzero(~y), keep]))
                ip, ih = sub(yp), sub(yh)
            if yp[ip].sum() < 10: continue
            held, score = crossfit(Xp[ip], yp[ip])
            auc = _auc(held, yp[ip])
            c = cut_with_floor(held, yp[ip], 0.2, floor) if auc >= 0.7 else None
            add = score(Xh[ih]) >= c if c is not None else np.zeros(len(ih), bool)
            call = d[ih] | add
            rows[f] = dict(auc=auc, adds=c is not None, **f1(call, yh[ih]), fpr=float((call & ~yh[ih]).sum() / max((~yh[ih]).sum(), 1)),
                           draft=f1(d[ih], yh[ih])["f1"])
        rare = [rows[k] for k in RARE_FINDINGS if k in rows]
        key = f"{prev_name}, floor {floor}"
        out[key] = {"rare_f1": float(np.mean([r["f1"] for r in rare])), "rare_p": float(np.mean([r["p"] for r in rare])),
                    "rare_r": float(np.mean([r["r"] for r in rare])), "rare_fpr": float(np.mean([r["fpr"] for r in rare])),
                    "all13_f1": float(np.mean([r["f1"] for r in rows.values()])),
                    "per_finding": {k: {kk: round(float(v), 3) for kk, v in r.items()} for k, r in rows.items() if k in RARE_FINDINGS}}
        print(key, {k: round(v, 3) for k, v in out[key].items() if k != "per_finding"}, flush=True)
Path(a.json).write_text(json.dumps(out, indent=1))
