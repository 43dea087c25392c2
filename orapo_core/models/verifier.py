"""The finding verifier: a round's check, read from the model's own state, that the image supports a finding it taught.

Why (issue 11; docs, Research): after a round on corrections of a finding the model never reported, its drafts
say the finding on 4-10 % of films without it, mostly films with a finding it co-occurs with. Yet the same model's
text state where the report begins (the last prompt token) tells those films apart far better than its drafts do:
on clinic 13, a linear probe of that state reads the finding at AUC 0.98 (d' 2.98) where the drafts reach d' 2.13.
So the round fits that probe: for each finding the round's corrections added (the clinician's signed report
asserts it, the model's draft did not), a ridge readout of the candidate's last prompt state, fitted on the
round's own training studies (PhantomCXR labels or the signed reports' FactS labels, never a test study), with
its threshold set on cross-fitted scores to keep `keep` of the positives. When drafting, a sentence asserting a
verified finding whose film scores under the threshold is left out of the draft and shown to the reader as
withheld, as the sample-agreement operating point does (`orapo_core.facts.consistency`).

The same readout also says the finding where the draft is silent (2026-12-05). On the rare-enriched ablation a
ridge readout of the prompt state found the rare findings at F1 0.50 where the same model's drafts reached 0.10
(docs, Research): the state carries what the decoder does not yet say. So a check whose cross-fitted AUC
reaches `ADD_MIN_AUC` (0.9) also has an `add_threshold`, the cut that maximises the cross-fitted F1 while calling at
most `add_max_fpr` (5 %) of the rows without the finding, at most `ADD_MAX_GROUP_FPR` (10 %) of those rows within
each group that carries one other finding (effusion, cardiomegaly, devices, "No Finding", ...: a group of fewer
than `MIN_GROUP_ROWS` such rows is judged by the overall rate alone), and being right on at least
`ADD_MIN_PRECISION` of those it calls; where no cut meets all three, the check adds nothing. A film scoring above
the cut whose draft does not state the finding gets a sentence stating it, chosen by the model among the
sentences the round's own reports state it with (`orapo_core.models.scoring.best_continuation`), in its findings
and impression, and what the sentence contradicts is taken out (shown as withheld;
`orapo_core.facts.consistency.add_findings`); the draft records the sentence as added by the check
(`Draft.added`), and every output of the draft says so.

Those limits are issue 40's (2026-12): adding was first allowed at AUC >= 0.7 under a 20 % cap (chosen on a
development set), and a user measured 15.5 % false positives from it, 32 % on films with a pleural effusion. A
verifier saved before then has no measured rates for its cuts (`add_fpr` None): it still withholds, never adds.

Pure numpy apart from `prompt_states`; saved as JSON beside the adapter (`VERIFIER_FILE`), so a version carries
the verifier its round fitted, and a model without one drafts as before.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.facts import label_report
from orapo_core.facts.text import split_sentences
from orapo_core.models.picture import DEFAULT_MAX_SIDE, to_rgb_image
from orapo_core.models.prompt import REPORT_PROMPT, render_prompt

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
    # whether a sentence stating the finding under `threshold` is withheld: only for a readout that reads the
    # finding at `MIN_AUC` or better (an older verifier's checks all did)
    withholds: bool = True
    # the score at or above which a draft silent on the finding gets a sentence stating it; None: never added
    add_threshold: float | None = None
    # what is added: sentences of the round's reports stating this finding and no other, most frequent first
    sentences: list[str] = field(default_factory=list)
    # the cut's cross-fitted false-positive rate among the round's rows without the finding (None: a cut not
    # measured so, as an older verifier's: it adds nothing), within each group of them carrying another finding
    # that has `MIN_GROUP_ROWS` rows or more, and the groups with fewer (judged by the overall rate alone)
    add_fpr: float | None = None
    add_group_fpr: dict[str, float] = field(default_factory=dict)
    add_groups_too_small: list[str] = field(default_factory=list)

    @property
    def adds(self) -> bool:
        """Whether the check states its finding where a draft is silent: read at `ADD_MIN_AUC` or better, with a
        cut measured against the false-positive limits and sentences to add."""
        auc = self.cross_fitted_auc
        return (
            self.add_threshold is not None
            and self.add_fpr is not None
            and bool(self.sentences)
            and auc is not None
            and not math.isnan(auc)
            and auc >= ADD_MIN_AUC
        )

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
            if check.withholds:
                for row in np.flatnonzero(check.score(states) < check.threshold):
                    out[row].add(name)
        return out

    def supported(self, states: np.ndarray) -> list[set[str]]:
        """Per state row, the findings whose check reads them clearly enough to state them (score at or above the
        check's `add_threshold`); a draft silent on one gets a sentence stating it."""
        states = np.atleast_2d(np.asarray(states, dtype=np.float64))
        out: list[set[str]] = [set() for _ in range(len(states))]
        for name, check in self.checks.items():
            if check.adds:
                for row in np.flatnonzero(check.score(states) >= check.add_threshold):
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


def _floor(negatives: np.ndarray, max_fpr: float) -> float:
    """The score a cut must exceed to call at most `max_fpr` of `negatives` (sorted ascending)."""
    allowed = int(np.floor(max_fpr * len(negatives) + 1e-9))  # how many rows without it may be called
    return float(negatives[len(negatives) - allowed - 1]) if allowed < len(negatives) else -np.inf


def add_cut(
    scores: np.ndarray,
    present: np.ndarray,
    max_fpr: float,
    min_precision: float = 0.0,
    *,
    groups: dict[str, np.ndarray] | None = None,
    max_group_fpr: float | None = None,
    min_group: int | None = None,
) -> float | None:
    """The score cut (call the finding at `>= cut`) with the best F1 on `scores` among those calling at most
    `max_fpr` of the rows without the finding and right at least `min_precision` of the time; None when no cut
    calls any row with it so. With `groups` (name: a mask of the rows carrying another finding), also at most
    `max_group_fpr` (`ADD_MAX_GROUP_FPR`) of the rows without the finding in each group with at least `min_group`
    (`MIN_GROUP_ROWS`) of them; a smaller group is judged by `max_fpr` overall alone."""
    scores, present = np.asarray(scores, dtype=np.float64), np.asarray(present, dtype=bool)
    floor = _floor(np.sort(scores[~present]), max_fpr)
    max_group_fpr = ADD_MAX_GROUP_FPR if max_group_fpr is None else max_group_fpr
    min_group = MIN_GROUP_ROWS if min_group is None else min_group
    for mask in (groups or {}).values():
        negatives = np.sort(scores[np.asarray(mask, dtype=bool) & ~present])
        if len(negatives) >= min_group:
            floor = max(floor, _floor(negatives, max_group_fpr))
    best, best_f1 = None, 0.0
    for cut in np.unique(scores[present & (scores > floor)]):
        called = scores >= cut
        tp = float((called & present).sum())
        f1 = 2 * tp / (called.sum() + present.sum())
        if f1 > best_f1 and tp >= min_precision * called.sum():
            best, best_f1 = float(cut), f1
    return best


def add_rates(
    scores: np.ndarray,
    present: np.ndarray,
    cut: float,
    groups: dict[str, np.ndarray] | None = None,
    *,
    min_group: int | None = None,
) -> tuple[float, dict[str, float], list[str]]:
    """At `cut`: the share of the rows without the finding it calls, that share within each group of `groups`
    with at least `min_group` such rows, and the groups with fewer (some, but too few to estimate a rate on)."""
    scores, present = np.asarray(scores, dtype=np.float64), np.asarray(present, dtype=bool)
    min_group = MIN_GROUP_ROWS if min_group is None else min_group
    called = scores >= cut
    overall = float(called[~present].mean()) if (~present).any() else 0.0
    rates, small = {}, []
    for name, mask in (groups or {}).items():
        rows = np.asarray(mask, dtype=bool) & ~present
        if rows.sum() >= min_group:
            rates[name] = round(float(called[rows].mean()), 4)
        elif rows.any():
            small.append(name)
    return round(overall, 4), rates, small


def fit_check(
    states: np.ndarray,
    present: Sequence[bool],
    finding: str,
    *,
    keep: float = 0.9,
    folds: int = 5,
    alpha: float = 1.0,
    seed: int = 0,
    add_max_fpr: float | None = None,
    groups: dict[str, np.ndarray] | None = None,
) -> FindingCheck:
    """A ridge readout of `finding` from `states` (rows: films), its threshold keeping `keep` of the positives'
    cross-fitted scores (each scored by a readout fitted on the other folds), so it is not set on scores of films
    the readout was fitted on; with `add_max_fpr`, also the cut above which it states the finding (`add_cut` on
    the same cross-fitted scores, right at least `ADD_MIN_PRECISION` of the time, within `ADD_MAX_GROUP_FPR` in
    each group of `groups` large enough), with its false-positive rates measured there (`add_rates`)."""
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
    add = add_cut(held, y, add_max_fpr, ADD_MIN_PRECISION, groups=groups) if add_max_fpr is not None else None
    rates = add_rates(held, y, add, groups) if add is not None else (None, {}, [])
    return FindingCheck(
        finding,
        mean.tolist(),
        std.tolist(),
        w[:-1].tolist(),
        float(w[-1]),
        threshold,
        int(y.sum()),
        int((~y).sum()),
        keep,
        round(_auc(held, y), 4),
        add_threshold=add,
        add_fpr=rates[0],
        add_group_fpr=rates[1],
        add_groups_too_small=rates[2],
    )


def prompt_states(model: Any, processor: Any, prompt_text: str, pictures: Sequence, *, batch: int = 32) -> np.ndarray:
    """(films, hidden): the text model's last-layer state at the last prompt token, where the report begins."""
    import torch

    out = []
    for b in range(0, len(pictures), batch):
        chunk = list(pictures[b : b + batch])
        inputs = processor(
            text=[prompt_text] * len(chunk), images=chunk, return_tensors="pt", padding=True, padding_side="left"
        ).to(model.device)
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


MIN_AUC = 0.9  # a check whose cross-fitted AUC on the round's own rows is lower withholds nothing (see fit_verifier)
# A check reading its finding at this cross-fitted AUC or better also states it where the draft is silent (never
# below: a readout at 0.7-0.9 added false findings to 15.5 % of films without them, issue 40), calling at most
# ADD_MAX_FPR of the round's rows without it, cross-fitted (the default of the round setting
# finding_verifier_add_max_fpr; it was 0.2, chosen on a development set of another seed) ...
ADD_MIN_AUC = 0.9
ADD_MAX_FPR = 0.05
# ... and at most ADD_MAX_GROUP_FPR of them within each group carrying one other finding (32 % of the films with a
# pleural effusion got a false finding at the 0.2 cap), judged on groups of at least MIN_GROUP_ROWS rows without
# the finding (fewer cannot estimate a rate of a few %: those groups are held to the overall cap alone). These are
# issue 40's goals, not limits tuned on any data set.
ADD_MAX_GROUP_FPR = 0.10
MIN_GROUP_ROWS = 20
# ... and only where at least this share of the rows it calls have the finding: at a clinic's prevalence (a few %)
# the best-F1 cut of a readout at AUC 0.75-0.85 states a rare finding on about 1 film in 10 without it (docs, Research).
ADD_MIN_PRECISION = 0.4
SENTENCES_PER_FINDING = 8


def finding_sentences(reports: Sequence[str], finding: str, *, limit: int = SENTENCES_PER_FINDING) -> list[str]:
    """The sentences of `reports` that state `finding` (present) and mention no other finding, most frequent
    first, at most `limit`: what a check may add to a draft silent on the finding."""
    counts: Counter[str] = Counter()
    for report in reports:
        for sentence in split_sentences(report or ""):
            said = {k: v for k, v in label_report(sentence.text).items() if v is not None and k != "No Finding"}
            if said == {finding: 1}:
                counts[sentence.text.strip()] += 1
    return [text for text, _ in counts.most_common(limit)]


def fit_verifier(
    states: np.ndarray,
    oracle_reports: Sequence[str],
    findings: Sequence[str],
    *,
    keep: float = 0.9,
    min_each: int = 10,
    min_auc: float = MIN_AUC,
    add_min_auc: float | None = ADD_MIN_AUC,
    add_max_fpr: float = ADD_MAX_FPR,
) -> FindingVerifier | None:
    """A check per finding of `findings` with at least `min_each` films with it and without it among the rows.
    It withholds where its cross-fitted AUC reaches `min_auc`: a readout that barely tells the finding from its
    absence on the round's own studies would withhold a tenth of the true statements for few false ones (on the
    clinic story, atelectasis read at 0.54-0.61, lung opacity at 0.85, the corrected pneumothorax at 0.97-0.99).
    It adds where that AUC reaches `add_min_auc` (None: never; never under `ADD_MIN_AUC` whatever is asked), at the
    cut `add_cut` picks with `add_max_fpr` overall and `ADD_MAX_GROUP_FPR` within each group of the rows without
    the finding that carry one other of the 14 CheXpert labels of the oracle reports (`label_report`), "No Finding"
    included; a check that does neither is dropped."""
    labels = [label_report(text or "") for text in oracle_reports]
    names = list(labels[0]) if labels else []
    carries = {name: np.array([lab.get(name) in (1, -1) for lab in labels]) for name in names}
    checks = {}
    for finding in findings:
        present = [lab.get(finding) in (1, -1) for lab in labels]
        if min(sum(present), len(present) - sum(present)) < min_each:
            continue
        groups = {name: mask for name, mask in carries.items() if name != finding}
        check = fit_check(states, present, finding, keep=keep, add_max_fpr=add_max_fpr, groups=groups)
        auc = check.cross_fitted_auc if check.cross_fitted_auc is not None else 0.0
        adds = add_min_auc is not None and auc >= max(add_min_auc, ADD_MIN_AUC) and check.add_threshold is not None
        sentences = finding_sentences([t for t, p in zip(oracle_reports, present) if p], finding) if adds else []
        check = replace(check, withholds=auc >= min_auc, sentences=sentences)
        if not sentences:  # it adds nothing: no cut, nor rates of one
            check = replace(check, add_threshold=None, add_fpr=None, add_group_fpr={}, add_groups_too_small=[])
        if check.withholds or check.add_threshold is not None:
            checks[finding] = check
    return FindingVerifier(checks) if checks else None


def describe(verifier: FindingVerifier | None) -> dict:
    """What a round records of its verifier: per finding, the counts it was fitted on, its cross-fitted AUC, and for
    a check that adds, the cross-fitted false-positive rates of its cut overall and per group of the rows without
    the finding carrying another finding, naming the groups too small to estimate (judged by the overall rate)."""
    if verifier is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, c in verifier.checks.items():
        out[name] = {
            "positives": c.n_positive,
            "negatives": c.n_negative,
            "keep": c.keep,
            "cross_fitted_auc": None
            if c.cross_fitted_auc is None or math.isnan(c.cross_fitted_auc)
            else c.cross_fitted_auc,
            "withholds": c.withholds,
            "adds": c.adds,
        }
        if c.adds:
            out[name].update({"add_fpr": c.add_fpr, "add_group_fpr": dict(c.add_group_fpr)})
            if c.add_groups_too_small:
                out[name]["add_groups_judged_overall_only"] = (
                    f"{', '.join(c.add_groups_too_small)}: fewer than {MIN_GROUP_ROWS} rows without the finding, "
                    f"judged by the overall rate alone"
                )
    return out


def _dataset_rows(dataset: Any) -> list[dict]:
    """The report columns of a round's training rows (absent columns as None)."""
    columns = set(dataset.column_names)
    texts = {
        c: list(dataset[c]) if c in columns else [None] * len(dataset)
        for c in ("oracle_report", "reference_report", "clinician_chosen", "clinician_rejected")
    }
    return [dict(zip(texts, values)) for values in zip(*texts.values())]


def _dataset_states(model: Any, processor: Any, dataset: Any, prompt: str | None) -> np.ndarray:
    """`prompt_states` of a round's training films, prepared as drafting prepares them, 32 at a time (a round on
    full-size films must not hold them all decoded)."""
    was_training = model.training
    model.eval()
    prompt_text = render_prompt(processor, prompt or REPORT_PROMPT)
    try:
        return np.concatenate(
            [
                prompt_states(
                    model,
                    processor,
                    prompt_text,
                    [to_rgb_image(image, max_side=DEFAULT_MAX_SIDE) for image in dataset[start : start + 32]["image"]],
                )
                for start in range(0, len(dataset), 32)
            ]
        )
    finally:
        model.train(was_training)


#: A finding needs this many positive films among a round's training rows for its readability to be measured.
MIN_READ_POSITIVES = 10


def unreadable_findings(
    model: Any, processor: Any, dataset: Any, *, min_auc: float, min_added: int = 3, prompt: str | None = None
) -> dict[str, float | None]:
    """The findings at least `min_added` of a round's corrections added (`taught_findings`) that `model`'s state
    where the report begins does not read: a cross-fitted ridge probe of it on the round's own training films
    (labels: their oracle reports, FactS) below `min_auc`, or fewer than `MIN_READ_POSITIVES` positives to tell
    (None). What the round's focused oracle NLL then leaves out (`oracle_nll_min_auc`)."""
    rows = _dataset_rows(dataset)
    findings = taught_findings(rows, min_taught=min_added)
    if not findings:
        return {}
    states = _dataset_states(model, processor, dataset, prompt)
    labels = [label_report(row["oracle_report"] or row["reference_report"] or "") for row in rows]
    out: dict[str, float | None] = {}
    for finding in findings:
        present = [lab.get(finding) in (1, -1) for lab in labels]
        if sum(present) < MIN_READ_POSITIVES or sum(present) > len(present) - MIN_READ_POSITIVES:
            out[finding] = None
            continue
        auc = fit_check(states, present, finding).cross_fitted_auc
        if auc is None or math.isnan(auc):
            out[finding] = None
        elif auc < min_auc:
            out[finding] = auc
    return out


def fit_round_verifier(
    model: Any,
    processor: Any,
    dataset: Any,
    *,
    keep: float = 0.9,
    min_taught: int = 10,
    prompt: str | None = None,
    add_max_fpr: float = ADD_MAX_FPR,
) -> FindingVerifier | None:
    """The verifier of a trained round: checks for the findings its corrections taught (`taught_findings`), fitted
    on the prompt states `model` gives the round's own training rows (`dataset`: the trainer's `datasets.Dataset`,
    with ``image``, ``oracle_report`` and the clinician columns), the films prepared as drafting prepares them.
    None when the round's corrections taught no finding often enough."""
    rows = _dataset_rows(dataset)
    findings = taught_findings(rows, min_taught=min_taught)
    if not findings:
        return None
    states = _dataset_states(model, processor, dataset, prompt)
    return fit_verifier(
        states,
        [row["oracle_report"] or row["reference_report"] or "" for row in rows],
        findings,
        keep=keep,
        min_each=min_taught,
        add_min_auc=ADD_MIN_AUC if add_max_fpr > 0 else None,
        add_max_fpr=add_max_fpr,
    )
