"""Measured 2026-12-05 (issue 11): does the trained model's own likelihood of stating a finding, after its draft's findings, tell films with the
finding from films without it? Per model: AUC on the training pool and on development films (seed 303), and the
F1 of (draft or likelihood above a cut chosen on the pool) on the development films. Run as

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/results/finding-check-2026-12-05/own-likelihood/own_likelihood.py \
        --adapter RUN/runs/orapo_1000/seed0 --data RUN/data --n-pool 400 --json OUT
(RUN: a rare-enriched `bench_learning.py --quick --keep-weights` output folder; the run itself read its paths from
/tmp, replaced here by the repository's and `--data`'s.)"""
import json, sys, argparse
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from benchmarks.ablation import phantom_split, RARE_FINDINGS
from orapo_core.models.loading import load_model
from orapo_core.models.verifier import finding_sentences, _auc, add_cut
from orapo_core.models.draft import to_rgb_image, Drafter
from orapo_core.models.evaluate import load_study_image, evaluate_drafter
from orapo_core.models.prompt import render_prompt
from orapo_core.models.scoring import answer_token_logps
from orapo_core.facts.consistency import findings_section_end
from orapo_core.train.dataset import load_training_records

p = argparse.ArgumentParser()
p.add_argument("--model", default=str(Path(__file__).resolve().parents[4] / "assets" / "starter"))
p.add_argument("--adapter")
p.add_argument("--data", required=True)
p.add_argument("--n-pool", type=int, default=400)
p.add_argument("--json")
a = p.parse_args()
data = Path(a.data)
tr = next(data.glob("train-*"))
PREV = {"pneumothorax": 0.25, "fracture": 0.25, "lung_lesion": 0.25, "pleural_other": 0.25}
ho = data / "dev303"
if not (ho / "phantom_cxr.csv").exists():
    phantom_split(ho, 200, 303, 224, None, PREV)
pool = load_training_records(tr, kind="phantom")
held = load_training_records(ho, kind="phantom")

loaded = load_model(a.model, a.adapter)
proc = loaded.processor
pt = render_prompt(proc)
drafter = Drafter(loaded)
rare = list(RARE_FINDINGS)
pool_sub = pool[: a.n_pool]
reports = [r.report for r in pool]
cands = {f: finding_sentences(reports, f) for f in rare}
print({f: len(c) for f, c in cands.items()}, flush=True)

def pos(lab, f): return lab.get(f) in (1, -1)

def scores(recs, preds):
    tok = proc.tokenizer
    out = {f: {"mean": [], "first": []} for f in rare}
    for r, pr in zip(recs, preds):
        pic = to_rgb_image(load_study_image(r.image_paths[0]))
        prefix = findings_section_end(pr["draft"])
        head = tok(prefix, add_special_tokens=False)["input_ids"] if prefix else []
        answers, spans, owner = [], [], []
        for f in rare:
            for c in cands[f]:
                whole = tok(prefix + c, add_special_tokens=False)["input_ids"]
                s = next((i for i, (x, y) in enumerate(zip(head, whole)) if x != y), min(len(head), len(whole)))
                answers.append(whole); spans.append((s, len(whole))); owner.append(f)
        with loaded.using() as m:
            lp, _, _ = answer_token_logps(m, proc, [pic] * len(answers), answers, prompt_text=pt)
        lp = lp.numpy()
        for f in rare:
            idx = [i for i, o in enumerate(owner) if o == f]
            means = [lp[i, spans[i][0]:spans[i][1]].mean() for i in idx]
            firsts = [lp[i, spans[i][0]] for i in idx]
            out[f]["mean"].append(max(means)); out[f]["first"].append(float(np.logaddexp.reduce(firsts)))
    return {f: {k: np.array(v) for k, v in d.items()} for f, d in out.items()}

def f1(pred, y):
    tp = (pred & y).sum(); fp = (pred & ~y).sum(); fn = (~pred & y).sum()
    pr = tp / max(tp + fp, 1); rc = tp / max(tp + fn, 1)
    return dict(f1=float(2 * pr * rc / max(pr + rc, 1e-9)), p=float(pr), r=float(rc), fpr=float(fp / max((~y).sum(), 1)))

rp = evaluate_drafter(drafter, pool_sub, batch_size=32, max_new_tokens=112).predictions
rh = evaluate_drafter(drafter, held, batch_size=32, max_new_tokens=112).predictions
sp, sh = scores(pool_sub, rp), scores(held, rh)
rows = {}
for f in rare:
    yp = np.array([pos(pr["reference"], f) for pr in rp]); yh = np.array([pos(pr["reference"], f) for pr in rh])
    dp = np.array([pos(pr["labels"], f) for pr in rp]); dh = np.array([pos(pr["labels"], f) for pr in rh])
    row = {"draft": f1(dh, yh)}
    for k in ("mean", "first"):
        cut = add_cut(sp[f][k], yp, 0.2, 0.4)
        pred = (sh[f][k] >= cut) if cut is not None else np.zeros_like(yh)
        row[k] = dict(auc_pool=_auc(sp[f][k], yp), auc_dev=_auc(sh[f][k], yh), cut=None if cut is None else float(cut),
                      check=f1(pred, yh), union=f1(dh | pred, yh))
    rows[f] = row
    print(f, "draft", round(row["draft"]["f1"], 3), {k: (round(row[k]["auc_pool"], 3), round(row[k]["auc_dev"], 3), round(row[k]["union"]["f1"], 3), round(row[k]["union"]["fpr"], 3)) for k in ("mean", "first")}, flush=True)
summ = {k: float(np.mean([rows[f][k]["union"]["f1"] for f in rare])) for k in ("mean", "first")}
summ["draft"] = float(np.mean([rows[f]["draft"]["f1"] for f in rare]))
print(summ)
if a.json: Path(a.json).write_text(json.dumps({"rows": rows, "summary": summ}, indent=1, default=float))
