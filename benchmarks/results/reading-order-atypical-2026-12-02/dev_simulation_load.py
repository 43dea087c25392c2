# Helpers of dev_simulation.py (load a drafted dev clinic; an early static variant of the atypicality score).
"""Offline simulation of the useful-first order on a drafted dev clinic (in memory, same scoring functions)."""
import sys, pickle, argparse, json
sys.path.insert(0, "/work/main")
from collections import Counter
from types import SimpleNamespace
import numpy as np
from app.services import reading_order as ro
from app.services.dashboard import stated_findings
from benchmarks.bench_round_story import report_of

RARE = ["pneumothorax", "fracture", "lung_lesion", "pleural_other"]

def load(base):
    from app.runtime import open_database
    from db import StudyRepository
    from orapo_core.config import Settings
    db = open_database(Settings(data_dir=f"{base}/clinic"))
    ovs = StudyRepository(db).list(status=list(ro.UNREAD), limit=100000)
    by_id = pickle.load(open(f"{base}/by_id.pkl", "rb"))
    return ovs, by_id

def atypicality(drafts, shrink=0.5):
    """residual Mahalanobis of image features given the draft's stated findings; percentile among given drafts"""
    X = np.array([d.image_features for d in drafts], float)
    names = sorted(set().union(*(stated_findings(d.text) for d in drafts)))
    A = np.array([[n in stated_findings(d.text) for n in names] + [1.0] for d in drafts], float)
    B, *_ = np.linalg.lstsq(A, X, rcond=None)
    R = X - A @ B
    C = np.cov(R.T); C = (1 - shrink) * C + shrink * np.trace(C) / C.shape[0] * np.eye(C.shape[0])
    s = np.einsum("ij,jk,ik->i", R, np.linalg.inv(C), R)
    return s

def simulate(ovs, by_id, variant, budget=300, seed=0):
    truth_text = {o.study.id: report_of(by_id[o.study.id]) for o in ovs}
    stated_cache = {}
    def st(t):
        if t not in stated_cache: stated_cache[t] = stated_findings(t)
        return stated_cache[t]
    unread = {o.study.id: o for o in ovs}
    drafts = {o.study.id: o.latest_draft for o in ovs}
    raw = atypicality([drafts[i] for i in unread]) if variant.get("w_atyp") else None
    order_ids = list(unread)
    if raw is not None:
        rank = np.argsort(np.argsort(raw)) / (len(raw) - 1)
        atyp = dict(zip(order_ids, rank))
    signed, read, curve = [], [], []
    rng = np.random.default_rng(seed)
    shuffled = list(rng.permutation(order_ids))
    for step in range(budget):
        if variant["name"] == "random":
            sid = int(shuffled[step])
        else:
            rates = Counter(); stated = Counter(); missed = Counter()
            for d, t, truth, drafted in signed:
                stated.update(truth); missed.update(truth - drafted)
            rates = {f: missed[f] / (stated[f] + 2) for f in stated}
            like = ro.finding_resemblance(signed) if variant.get("image", True) else {}
            best, bs = None, -1
            for sid_, o in unread.items():
                u = ro.usefulness(o, rates, like)
                a, b, c = ro.WEIGHTS
                s = a * u.inconsistency + b * u.disagreement + c * u.missed
                if raw is not None:
                    s = s + variant["w_atyp"] * atyp[sid_]
                if s > bs: best, bs = sid_, s
            sid = best
        o = unread.pop(sid)
        d = drafts[sid]
        signed.append((d, truth_text[sid], st(truth_text[sid]), st(d.text)))
        read.append(sid)
        if len(read) % 25 == 0:
            curve.append(sum(len({f.kind for f in by_id[s].findings} & set(RARE)) for s in read))
    return curve

if __name__ == "__main__":
    p = argparse.ArgumentParser(); p.add_argument("base"); p.add_argument("--variants", default="all"); p.add_argument("--budget", type=int, default=300)
    a = p.parse_args()
    ovs, by_id = load(a.base)
    pool_rare = {k: sum(any(f.kind == k for f in s.findings) for s in by_id.values()) for k in RARE}
    print("pool rare", pool_rare, flush=True)
    variants = [dict(name="random"), dict(name="useful"), dict(name="atyp0.3", w_atyp=0.3), dict(name="atyp0.6", w_atyp=0.6)]
    for v in variants:
        c = simulate(ovs, by_id, v, a.budget)
        print(v["name"], c, flush=True)
