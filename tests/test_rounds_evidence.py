"""The gate's statistics on literal data: the paired bootstrap, per-finding rates, what corrections changed, and the
held-out set's top-up with PhantomCXR studies at the usual prevalence, as negatives of the corrected findings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.services.rounds.evidence import (
    TOPUP_SOURCE,
    corrected_findings,
    finding_changes,
    finding_rates,
    paired_interval,
    resample_weights,
)
from orapo_core.facts.metrics import clinical_efficacy


def row(i, reference, stated, reward=None):
    return {
        "study_id": f"s{i}",
        "labels": dict.fromkeys(stated, 1),
        "reference": dict.fromkeys(reference, 1),
        "facts_score": reward,
    }


REFERENCE = [{"Cardiomegaly"}, {"Edema"}, {"Cardiomegaly", "Pleural Effusion"}, set(), {"Edema"}, {"Pleural Effusion"}]
SERVED_STATED = [{"Cardiomegaly"}, set(), {"Cardiomegaly"}, {"Edema"}, {"Edema"}, set()]
CANDIDATE_STATED = [{"Cardiomegaly"}, {"Edema"}, {"Cardiomegaly", "Pleural Effusion"}, set(), {"Edema"}, {"Edema"}]
SERVED = [
    row(i, *study) for i, study in enumerate(zip(REFERENCE, SERVED_STATED, [0.6, 0.2, 0.5, 0.4, 0.9, 0.1], strict=True))
]
CANDIDATE = [
    row(i, *study)
    for i, study in enumerate(zip(REFERENCE, CANDIDATE_STATED, [0.7, 0.6, None, 0.5, 0.9, 0.3], strict=True))
]


def brute_force(metric, weights):
    """The metric of each model on the studies drawn (study i repeated weights[i] times), recomputed from scratch."""

    def value(rows):
        drawn = [r for r, k in zip(rows, weights, strict=True) for _ in range(int(k))]
        if metric == "macro_f1_14":
            return clinical_efficacy([r["labels"] for r in drawn], [r["reference"] for r in drawn]).macro_f1_14
        scores = [r["facts_score"] for r in drawn if r["facts_score"] is not None]
        return sum(scores) / len(scores) if scores else float("nan")

    return value(CANDIDATE) - value(SERVED)


@pytest.mark.parametrize("metric", ["macro_f1_14", "facts_reward_mean"])
def test_the_paired_bootstrap_is_the_metric_recomputed_on_the_same_resampled_studies_for_both_models(metric):
    interval = paired_interval(metric, CANDIDATE, SERVED, resamples=300, seed=7)
    everything = brute_force(metric, [1] * len(SERVED))
    assert interval.delta == pytest.approx(everything) and interval.studies == 6
    if metric == "macro_f1_14":  # the point estimates are the evaluator's own numbers
        assert interval.served == pytest.approx(
            clinical_efficacy([r["labels"] for r in SERVED], [r["reference"] for r in SERVED]).macro_f1_14
        )
    else:  # the unscorable draft is left out of the candidate's mean, as evaluate_drafter leaves it out
        assert interval.candidate == pytest.approx((0.7 + 0.6 + 0.5 + 0.9 + 0.3) / 5)
    draws = [brute_force(metric, w) for w in resample_weights(6, 300, seed=7)]
    low, high = np.nanpercentile(draws, [2.5, 97.5])
    assert (interval.low, interval.high) == (pytest.approx(low), pytest.approx(high))
    assert interval.low <= interval.delta <= interval.high
    assert paired_interval(metric, CANDIDATE, SERVED, resamples=300, seed=7) == interval  # a fixed seed: the same


def test_resampling_draws_n_studies_with_replacement_and_identical_models_differ_by_exactly_nothing():
    weights = resample_weights(6, 50)
    assert weights.shape == (50, 6) and (weights.sum(axis=1) == 6).all() and (weights >= 0).all()
    same = paired_interval("macro_f1_14", SERVED, SERVED)
    assert same.delta == same.low == same.high == 0.0
    assert paired_interval("macro_f1_14", [], []) is None
    assert paired_interval("facts_reward_mean", [row(0, set(), set())], [row(0, set(), set())]) is None  # no reward
    with pytest.raises(ValueError):
        paired_interval("macro_f1_14", CANDIDATE, SERVED[:3])


def test_recall_and_false_positive_rate_are_counts():
    rates = finding_rates(CANDIDATE, "Pleural Effusion")
    assert (rates.recall.hits, rates.recall.of, rates.fpr.hits, rates.fpr.of) == (1, 2, 0, 4)
    edema = finding_rates(CANDIDATE, "Edema")
    assert str(edema.recall) == "2/2 = 100.0%" and str(edema.fpr) == "1/4 = 25.0%"


def test_a_correction_adds_what_the_signed_report_states_and_the_draft_did_not_and_removes_the_other_way():
    pairs = [  # (signed report's labels, the model's draft's labels)
        ({"Pleural Effusion": 1}, {"No Finding": 1}),
        ({"Pleural Effusion": -1, "Edema": 1}, {"Edema": 1}),  # uncertain counts as stated, as the metrics count it
        ({"Pleural Effusion": 1}, {"Pleural Effusion": 0, "Cardiomegaly": 1}),
        ({"Cardiomegaly": 0}, {"Cardiomegaly": 1}),
        ({}, {}),
    ]
    changes = finding_changes(pairs)
    assert changes == {"Pleural Effusion": {"added": 3, "removed": 0}, "Cardiomegaly": {"added": 0, "removed": 2}}
    assert "No Finding" not in changes  # the absence of the others, not a finding of its own
    assert corrected_findings(changes, 3) == ["Pleural Effusion"]
    assert corrected_findings(changes, 2) == ["Cardiomegaly", "Pleural Effusion"]  # in CheXpert order


# --- the held-out set's top-up -----------------------------------------------------------------------------------


def heldout_study(i, *positive):
    from app.services.rounds.heldout import HeldoutStudy

    return HeldoutStudy(
        study_id=f"db-{i}", image_path=f"/x/{i}.png", findings="", impression="", labels=dict.fromkeys(positive, 1)
    )


def test_the_top_up_draws_the_pool_in_chunks_until_each_corrected_finding_has_enough_negatives():
    from app.services.rounds.heldout import HeldoutSet, negatives_short, top_up

    own = [heldout_study(i, "Pleural Effusion") for i in range(4)] + [heldout_study(i) for i in range(4, 10)]
    own += [heldout_study(10, "Edema"), heldout_study(11, "Edema")]
    heldout = HeldoutSet("holdout_studies", own, signed=12)
    # effusion: 8 negatives, edema: 10; to give each 15, effusion lacks 7 and edema 5
    assert negatives_short(own, ["Pleural Effusion", "Edema"], 15) == {"Pleural Effusion": 7, "Edema": 5}
    asked = []

    def pool(start, n):  # a pool at "usual prevalence": every third film an effusion, every fifth edema too
        asked.append((start, n))
        return [
            heldout_study(100 + i, *(["Pleural Effusion"] if i % 3 == 0 else []) + (["Edema"] if i % 5 == 0 else []))
            for i in range(start, start + n)
        ]

    topped = top_up(heldout, ["Pleural Effusion", "Edema"], 15, pool, chunk=4)
    added = topped.studies[12:]
    assert asked == [(0, 4), (4, 4), (8, 4)] and topped.studies[:12] == own  # chunks, only as far as needed
    # film 100 states both (a negative of neither: left out); 103 and 106 have an effusion: edema's negatives
    assert [s.study_id for s in added] == [f"db-{100 + i}" for i in (1, 2, 3, 4, 5, 6, 7, 8, 10)]
    assert all(s.source == TOPUP_SOURCE for s in added)
    assert {"Pleural Effusion"} in [set(s.labels) for s in added]
    assert negatives_short(topped.studies, ["Pleural Effusion", "Edema"], 15) == {}
    assert topped.topped_up_for == ["Pleural Effusion", "Edema"] and topped.signed == 12
    summary = topped.summary()
    assert summary.sources == {"holdout_studies": 12, TOPUP_SOURCE: 9} and summary.n == 21
    assert top_up(heldout, ["Pleural Effusion"], 8, pool) is heldout and len(asked) == 3  # enough: nothing drawn
    assert top_up(heldout, [], 100, pool) is heldout


def test_the_top_up_stops_at_its_cap_and_leaves_a_finding_short():
    from app.services.rounds.heldout import HeldoutSet, negatives_short, top_up

    heldout = HeldoutSet("holdout_studies", [heldout_study(i) for i in range(5)], signed=5)
    asked = []

    def pool(start, n):  # pleural other on every other film
        asked.append((start, n))
        return [heldout_study(100 + i, *(["Pleural Other"] if i % 2 else [])) for i in range(start, start + n)]

    topped = top_up(heldout, ["Pleural Other"], 100, pool, limit=25, chunk=10)
    assert asked == [(0, 10), (10, 10), (20, 5)]
    assert len(topped.studies) == 5 + 13 and negatives_short(topped.studies, ["Pleural Other"], 100) == {
        "Pleural Other": 82
    }


def test_select_heldout_tops_up_from_a_usual_prevalence_pool_so_effusion_films_are_pleural_others_negatives(tmp_path):
    from app.runtime import open_database
    from app.services.rounds.evidence import finding_check
    from app.services.rounds.heldout import HeldoutSet, select_heldout
    from orapo_core.config import Settings
    from orapo_core.facts.metrics import is_positive

    settings = Settings(data_dir=tmp_path / "data", deid_secret="t")
    db = open_database(settings)
    corrected = ["Pleural Other", "Pleural Effusion"]
    heldout = select_heldout(
        db, settings, min_heldout=5, phantom_studies=30, phantom_size=64, negatives_for=corrected, min_negatives=40
    )
    own = [s for s in heldout.studies if not s.source]
    added = [s for s in heldout.studies if s.source == TOPUP_SOURCE]
    assert heldout.source == "phantomcxr_valid" and own and added
    for finding in corrected:
        assert sum(not is_positive(s.labels, finding) for s in heldout.studies) >= 40
    other_negatives = [s for s in added if not is_positive(s.labels, "Pleural Other")]
    with_effusion = [s for s in other_negatives if is_positive(s.labels, "Pleural Effusion")]
    assert with_effusion  # the films where a model taught pleural other states it wrongly
    assert any(is_positive(s.labels, name) for s in other_negatives for name in ("Cardiomegaly", "Support Devices"))
    assert all(s.study_id.startswith("phantom-topup-") and Path(s.image_path).is_file() for s in added)
    assert heldout.summary().sources == {"phantomcxr_valid": len(own), TOPUP_SOURCE: len(added)}
    assert heldout.topped_up_for == corrected

    # drafted perfectly: the top-up's effusion films are effusion's recall for neither model, and Pleural Other's negatives
    rows = [
        {"study_id": r.study_id, "labels": r.labels, "reference": r.labels, "source": r.source}
        for r in heldout.records()
    ]
    effusion = finding_check("Pleural Effusion", {}, rows, rows)
    assert effusion.served.recall.of == sum(is_positive(s.labels, "Pleural Effusion") for s in own)
    other = finding_check("Pleural Other", {}, rows, rows)
    assert other.topped_up == len(other_negatives) and other.served.fpr.of >= 40

    heldout.write(tmp_path / "heldout.json")
    again = HeldoutSet.read(tmp_path / "heldout.json")
    assert again == heldout and {r.source for r in again.records()} == {"phantomcxr_valid", TOPUP_SOURCE}
    pool = sorted((settings.resolved_data_dir / "heldout").glob("phantomcxr-pool-*/*"))
    assert [p.name for p in pool] == ["0-100"] and pool[0].parent.name == "phantomcxr-pool-30000000-64"
    stamp = (pool[0] / ".complete").stat().st_mtime_ns
    assert (
        select_heldout(
            db, settings, min_heldout=5, phantom_studies=30, phantom_size=64, negatives_for=corrected, min_negatives=40
        )
        == heldout
        and (pool[0] / ".complete").stat().st_mtime_ns == stamp
    )
