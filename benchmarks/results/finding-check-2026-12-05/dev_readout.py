"""Measured before the finding check's additions were built (2026-12-05): what a ridge readout of a trained model's
prompt state, fitted on the ablation's training pool with PhantomCXR's labels and cut on cross-fitted scores, finds
on a development set of another generator seed (303, never the ablation's evaluation seed 202), against the same
model's greedy drafts. Kept as it was run:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/results/finding-check-2026-12-05/dev_readout.py \
        --adapter RUN/runs/orapo_1000/seed0 --data RUN/data --json OUT
(RUN: a rare-enriched `bench_learning.py --quick --keep-weights` output folder.)
"""
import json, sys, argparse
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.ablation import phantom_split, RARE_FINDINGS
from orapo_core.models.loading import load_model
from orapo_core.models.verifier import prompt_states, fit_check, _auc
from orapo_core.models.draft import to_rgb_image, Drafter
from orapo_core.models.evaluate import load_study_image, evaluate_drafter
from orapo_core.models.prompt import render_prompt
from orapo_core.facts import label_report

p = argparse.ArgumentParser()
p.add_argument("--model", default=str(Path(__file__).resolve().parents[3] / "assets" / "starter"))
p.add_argument("--adapter")
p.add_argument("--data", required=True)
p.add_argument("--json")
a = p.parse_args()
data = Path(a.data)
tr = next(data.glob("train-*"))
PREV = {"pneumothorax": 0.25, "fracture": 0.25, "lung_lesion": 0.25, "pleural_other": 0.25}
ho = Path(a.data) / "dev303"; phantom_split(ho, 200, 303, 224, None, PREV)
from orapo_core.train.dataset import load_training_records
pool = load_training_records(tr, kind="phantom"); held = load_training_records(ho, kind="phantom")
loaded = load_model(a.model, a.adapter)
proc = loaded.processor
pt = render_prompt(proc)
def states(recs):
    out = []
    for i in range(0, len(recs), 32):
        pics = [to_rgb_image(load_study_image(r.image_paths[0])) for r in recs[i:i+32]]
        with loaded.using() as m:
            out.append(prompt_states(m, proc, pt, pics))
    return np.concatenate(out)
Xp, Xh = states(pool), states(held)
drafter = Drafter(loaded)
res = evaluate_drafter(drafter, held, batch_size=32, max_new_tokens=112)
def pos(lab, f): return lab.get(f) in (1, -1)
out = {}
def f1(pred, y):
    tp = (pred & y).sum(); fp = (pred & ~y).sum(); fn = (~pred & y).sum()
    pr = tp / max(tp+fp, 1); rc = tp / max(tp+fn, 1)
    return dict(f1=2*pr*rc/max(pr+rc,1e-9), p=pr, r=rc)
from orapo_core.facts.ontology import CHEXPERT_14
from orapo_core.models.verifier import _ridge
rng = np.random.default_rng(0)
def crossfit(X, y, folds=5, alpha=1.0):
    mean, std = X.mean(0), X.std(0) + 1e-6
    z = (X - mean) / std; t = np.where(y, 1.0, -1.0)
    order = rng.permutation(len(y)); held = np.empty(len(y))
    for k in range(folds):
        te = order[k::folds]; fi = np.setdiff1d(order, te)
        w = _ridge(z[fi], t[fi], alpha); held[te] = z[te] @ w[:-1] + w[-1]
    w = _ridge(z, t, alpha)
    return held, (lambda Xn: ((Xn - mean) / std) @ w[:-1] + w[-1])
rows = {}
preds = res.predictions
for f in CHEXPERT_14:
    if f == "No Finding": continue
    yp = np.array([pos(r.labels, f) for r in pool]); yh = np.array([pos(pr["reference"], f) for pr in preds])
    d = np.array([pos(pr["labels"], f) for pr in preds])
    if yp.sum() < 10 or (~yp).sum() < 10: continue
    held_s, score = crossfit(Xp, yp)
    cands = np.quantile(held_s, np.linspace(0.02, 0.98, 97))
    best = max(cands, key=lambda t: f1(held_s >= t, yp)["f1"])
    # add threshold: precision >= 0.7 on cross-fitted, else best
    keep_t = np.quantile(held_s[yp], 0.1)
    negs = np.sort(held_s[~yp])
    caps = {}
    for cap in (0.02, 0.05, 0.1, 0.2):
        floor = negs[min(len(negs) - 1, int(np.ceil((1 - cap) * len(negs))))]
        ok = [t for t in cands if t >= floor] + [floor]
        caps[cap] = max(ok, key=lambda t: f1(held_s >= t, yp)["f1"])
    sh = score(Xh)
    rows[f] = dict(n_pos_pool=int(yp.sum()), n_pos_held=int(yh.sum()), cf_auc=_auc(held_s, yp), held_auc=_auc(sh, yh) if 0 < yh.sum() < len(yh) else None,
                   draft=f1(d, yh), readout=f1(sh >= best, yh), union=f1(d | (sh >= best), yh), verified=f1(d & (sh >= keep_t), yh),
                   union_verified=f1((d & (sh >= keep_t)) | (sh >= best), yh),
                   **{f"cap{c}": f1(d | (sh >= t), yh) for c, t in caps.items()}, fpr_union={c: float(((d | (sh >= t)) & ~yh).sum() / max((~yh).sum(), 1)) for c, t in caps.items()})
def macro(keys, kind):
    return float(np.mean([rows[k][kind]["f1"] for k in keys if k in rows]))
summary = {kind: {"rare": macro(RARE_FINDINGS, kind), "all13": macro(list(rows), kind)} for kind in ("draft","readout","union","verified","union_verified","cap0.02","cap0.05","cap0.1","cap0.2")}
for f, r in rows.items():
    print(f"{f:28s} pos {r['n_pos_pool']:4d}/{r['n_pos_held']:3d} cfAUC {r['cf_auc']:.3f} hAUC {r['held_auc'] or 0:.3f} " + " ".join(f"{k} {r[k]['f1']:.2f}({r[k]['p']:.2f}/{r[k]['r']:.2f})" for k in ("draft","readout","cap0.05","cap0.1","cap0.2")))
print(json.dumps(summary, indent=1))
if a.json: Path(a.json).write_text(json.dumps({"rows": rows, "summary": summary}, default=float, indent=1))
