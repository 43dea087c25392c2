"""The finding verifier: a round's check, read from the model's own state, that the image supports a finding it taught.

Why (issue 11; README, Benchmarks): after a round on corrections of a finding the model never reported, its drafts
say the finding on 4-10 % of films without it, mostly films with a finding it co-occurs with. Yet the same model's
text state where the report begins (the last prompt token) tells those films apart far better than its drafts do:
on clinic 13, a linear probe of that state reads the finding at AUC 0.98 (d' 2.98) where the drafts reach d' 2.13.
So the round fits that probe: for each finding the round's corrections added (the clinician's signed report
asserts it, the model's draft did not), a ridge readout of the candidate's last prompt state, fitted on the
round's own training studies (PhantomCXR labels or the signed reports' FactS labels, never a test study), with
its threshold set on cross-fitted scores to keep `keep` of the positives. When drafting, a sentence asserting a
verified finding whose film scores under the threshold is left out of the draft and shown to the reader as
withheld, as the sample-agreement operating point does (`orapo_core.facts.consistency`).

Pure numpy apart from `prompt_states`; saved as JSON beside the adapter (`VERIFIER_FILE`), so a version carries
the verifier its round fitted, and a model without one drafts as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

VERIFIER_FILE = "finding_verifier.json"


@dataclass(frozen=True)
class FindingCheck:
    """One finding's readout: standardise the state, project on `weights` (+ bias), compare with `threshold`."""

    finding: str
    mean: list[float]
    std: list[float]
    weights: list[float]
    bias: float
    threshold: float
    n_positive: int
    n_negative: int
    keep: float
    cross_fitted_auc: float | None = None

    def score(self, states: np.ndarray) -> np.ndarray:
        x = (np.asarray(states, dtype=np.float64) - np.asarray(self.mean)) / np.asarray(self.std)
        return x @ np.asarray(self.weights) + self.bias


@dataclass(frozen=True)
class FindingVerifier:
    checks: dict[str, FindingCheck] = field(default_factory=dict)

    def unsupported(self, states: np.ndarray) -> list[set[str]]:
        """Per state row, the verified findings its film does not support (score under the threshold)."""
        states = np.atleast_2d(np.asarray(states, dtype=np.float64))
        out: list[set[str]] = [set() for _ in range(len(states))]
        for name, check in self.checks.items():
            for row in np.flatnonzero(check.score(states) < check.threshold):
                out[row].add(name)
        return out

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / VERIFIER_FILE
        path.write_text(json.dumps({"checks": [asdict(c) for c in self.checks.values()]}))
        return path

    @classmethod
    def load(cls, folder: str | Path | None) -> FindingVerifier | None:
        """The verifier saved in `folder`, or None when there is none (a model drafts as before)."""
        if folder is None or not (Path(folder) / VERIFIER_FILE).is_file():
            return None
        data = json.loads((Path(folder) / VERIFIER_FILE).read_text())
        checks = [FindingCheck(**c) for c in data.get("checks", [])]
        return cls({c.finding: c for c in checks}) if checks else None


def _ridge(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    return np.linalg.solve(x.T @ x + alpha * len(x) * np.eye(x.shape[1]), x.T @ y)


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels], scores[~labels]
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def fit_check(states: np.ndarray, present: Sequence[bool], finding: str, *, keep: float = 0.9, folds: int = 5,
              alpha: float = 1.0, seed: int = 0) -> FindingCheck:
    """A ridge readout of `finding` from `states` (rows: films), its threshold keeping `keep` of the positives'
    cross-fitted scores (each scored by a readout fitted on the other folds), so it is not set on scores of films
    the readout was fitted on."""
    x, y = np.asarray(states, dtype=np.float64), np.asarray(present, dtype=bool)
    mean, std = x.mean(0), x.std(0) + 1e-6
    z = (x - mean) / std
    target = np.where(y, 1.0, -1.0)
    order = np.random.default_rng(seed).permutation(len(y))
    held = np.empty(len(y))
    for k in range(folds):
        test = order[k::folds]
        fit = np.setdiff1d(order, test)
        w = _ridge(z[fit], target[fit], alpha)
        held[test] = z[test] @ w[:-1] + w[-1]
    w = _ridge(z, target, alpha)
    threshold = float(np.quantile(held[y], 1.0 - keep))
    return FindingCheck(finding, mean.tolist(), std.tolist(), w[:-1].tolist(), float(w[-1]), threshold,
                        int(y.sum()), int((~y).sum()), keep, round(_auc(held, y), 4))


def prompt_states(model, processor, prompt_text: str, pictures: Sequence, *, batch: int = 32) -> np.ndarray:
    """(films, hidden): the text model's last-layer state at the last prompt token, where the report begins."""
    import torch

    out = []
    for b in range(0, len(pictures), batch):
        chunk = list(pictures[b:b + batch])
        inputs = processor(text=[prompt_text] * len(chunk), images=chunk, return_tensors="pt", padding=True,
                           padding_side="left").to(model.device)
        for key, value in inputs.items():
            if torch.is_floating_point(value) and value.dtype != model.dtype:
                inputs[key] = value.to(model.dtype)
        with torch.inference_mode():
            hidden = model(**inputs, output_hidden_states=True).hidden_states[-1][:, -1]
        out.append(hidden.float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0))


def taught_findings(rows: Sequence[dict], *, min_taught: int = 10) -> list[str]:
    """CheXpert findings that at least `min_taught` corrections added: the signed report (`clinician_chosen`)
    states or hedges it, the model's draft (`clinician_rejected`) did not."""
    from orapo_core.facts import label_report

    counts: dict[str, int] = {}
    for row in rows:
        chosen, rejected = row.get("clinician_chosen") or "", row.get("clinician_rejected") or ""
        if not chosen or not rejected:
            continue
        said = label_report(rejected)
        for name, value in label_report(chosen).items():
            if name != "No Finding" and value in (1, -1) and said.get(name) not in (1, -1):
                counts[name] = counts.get(name, 0) + 1
    return sorted(name for name, n in counts.items() if n >= min_taught)


MIN_AUC = 0.9  # a check whose cross-fitted AUC on the round's own rows is lower is not used (see fit_verifier)


def fit_verifier(states: np.ndarray, oracle_reports: Sequence[str], findings: Sequence[str], *, keep: float = 0.9,
                 min_each: int = 10, min_auc: float = MIN_AUC) -> FindingVerifier | None:
    """A check per finding of `findings` with at least `min_each` films with it and without it among the rows, kept
    where its cross-fitted AUC reaches `min_auc`: a readout that barely tells the finding from its absence on the
    round's own studies would withhold a tenth of the true statements for few false ones (on the clinic story,
    atelectasis read at 0.54-0.61, lung opacity at 0.85, the corrected pneumothorax at 0.97-0.99)."""
    from orapo_core.facts import label_report

    labels = [label_report(text or "") for text in oracle_reports]
    checks = {}
    for finding in findings:
        present = [lab.get(finding) in (1, -1) for lab in labels]
        if min(sum(present), len(present) - sum(present)) >= min_each:
            check = fit_check(states, present, finding, keep=keep)
            if check.cross_fitted_auc is not None and check.cross_fitted_auc >= min_auc:
                checks[finding] = check
    return FindingVerifier(checks) if checks else None


def describe(verifier: FindingVerifier | None) -> dict:
    """What a round records of its verifier: per finding, the counts it was fitted on and its cross-fitted AUC."""
    if verifier is None:
        return {}
    return {name: {"positives": c.n_positive, "negatives": c.n_negative, "keep": c.keep,
                   "cross_fitted_auc": None if c.cross_fitted_auc is None or math.isnan(c.cross_fitted_auc)
                   else c.cross_fitted_auc} for name, c in verifier.checks.items()}


def fit_round_verifier(model, processor, dataset, *, keep: float = 0.9, min_taught: int = 10,
                       prompt: str | None = None) -> FindingVerifier | None:
    """The verifier of a trained round: checks for the findings its corrections taught (`taught_findings`), fitted
    on the prompt states `model` gives the round's own training rows (`dataset`: the trainer's `datasets.Dataset`,
    with ``image``, ``oracle_report`` and the clinician columns), the films prepared as drafting prepares them.
    None when the round's corrections taught no finding often enough."""
    from orapo_core.models.draft import DEFAULT_MAX_SIDE, to_rgb_image
    from orapo_core.models.prompt import REPORT_PROMPT, render_prompt

    columns = set(dataset.column_names)
    texts = {c: list(dataset[c]) if c in columns else [None] * len(dataset)
             for c in ("oracle_report", "reference_report", "clinician_chosen", "clinician_rejected")}
    rows = [dict(zip(texts, values)) for values in zip(*texts.values())]
    findings = taught_findings(rows, min_taught=min_taught)
    if not findings:
        return None
    was_training = model.training
    model.eval()
    prompt_text = render_prompt(processor, prompt or REPORT_PROMPT)
    try:  # a chunk of films at a time: a round on full-size films must not hold them all decoded
        states = np.concatenate([
            prompt_states(model, processor, prompt_text,
                          [to_rgb_image(image, max_side=DEFAULT_MAX_SIDE) for image in dataset[start:start + 32]["image"]])
            for start in range(0, len(dataset), 32)])
    finally:
        model.train(was_training)
    return fit_verifier(states, [row["oracle_report"] or row["reference_report"] or "" for row in rows],
                        findings, keep=keep, min_each=min_taught)
