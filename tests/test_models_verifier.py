"""The finding verifier: its fit on literal states, what it withholds from a draft, and its round on a tiny VLM."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from orapo_core.models.verifier import (
    ADD_MAX_FPR,
    ADD_MIN_PRECISION,
    MIN_GROUP_ROWS,
    VERIFIER_FILE,
    FindingVerifier,
    add_cut,
    add_rates,
    describe,
    finding_sentences,
    fit_check,
    fit_verifier,
    taught_findings,
)

PTX = "There is a moderate right pneumothorax with a visible pleural line. No pleural effusion."
CLEAR = "The lungs are clear. No pneumothorax. No pleural effusion."


def _states(n: int, shift: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Films whose first coordinate carries the finding (by `shift`), the others noise."""
    rng = np.random.default_rng(seed)
    present = rng.random(n) < 0.4
    x = rng.normal(size=(n, 6))
    x[:, 0] += shift * present
    return x, present


def test_a_check_keeps_about_its_share_of_new_positives_and_stops_most_negatives():
    x, present = _states(400, 4.0)
    check = fit_check(x, present, "Pneumothorax", keep=0.9)
    assert check.cross_fitted_auc > 0.95 and check.n_positive == present.sum()
    new, truth = _states(2000, 4.0, seed=1)
    passed = check.score(new) >= check.threshold
    assert 0.85 <= passed[truth].mean() <= 0.95  # the threshold was set on cross-fitted scores, not fitted ones
    assert passed[~truth].mean() < 0.05


def test_only_findings_with_enough_rows_and_a_readable_state_get_a_check():
    x, present = _states(300, 4.0)
    reports = [PTX if p else CLEAR for p in present]
    verifier = fit_verifier(x, reports, ["Pneumothorax", "Pleural Effusion"])
    assert set(verifier.checks) == {"Pneumothorax"}  # no film states an effusion: nothing to fit it on
    noise = np.random.default_rng(5).normal(size=x.shape)
    assert fit_verifier(noise, reports, ["Pneumothorax"]) is None  # AUC near 0.5: not used


def test_the_add_cut_has_the_best_f1_within_the_false_positive_cap():
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    present = np.array([0, 0, 0, 0, 1, 0, 1, 1, 0, 1], dtype=bool)
    # uncapped, calling from 0.5 finds all four positives for two negatives (F1 0.8): the best cut
    assert add_cut(scores, present, 1.0) == 0.5
    # one of the six negatives at most (0.9 is one): from 0.7, 3 of 4 positives (F1 0.75)
    assert add_cut(scores, present, 1 / 6) == 0.7
    # no negative at all: only 1.0 (F1 0.4)
    assert add_cut(scores, present, 0.0) == 1.0
    assert add_cut(scores, np.zeros(10, dtype=bool), 0.5) is None  # nothing to find
    # right at least 3 times in 4: from 0.7 (3 of 4 called, F1 0.75); from 0.5, 4 of 6 called falls short
    assert add_cut(scores, present, 1.0, min_precision=0.75) == 0.7
    assert add_cut(scores, present, 1.0, min_precision=1.01) is None


def test_a_check_read_under_auc_0_9_never_adds_and_one_read_above_adds_within_the_caps():
    x, present = _states(400, 1.6)  # a readout of AUC about 0.85: it used to add (at AUC >= 0.7), now it may not
    reports = [PTX if p else CLEAR for p in present]
    check = fit_check(x, present, "Pneumothorax", add_max_fpr=0.2)
    assert 0.8 <= check.cross_fitted_auc < 0.9
    # neither withholds (AUC < 0.9) nor adds (AUC < 0.9), whatever add_min_auc or cap is asked: no check
    assert fit_verifier(x, reports, ["Pneumothorax"]) is None
    assert fit_verifier(x, reports, ["Pneumothorax"], add_min_auc=0.7, add_max_fpr=0.2) is None
    # nor does a check of that AUC add when built (or loaded) with a cut and sentences
    made = replace(check, sentences=["Small left pneumothorax."], add_fpr=0.04)
    assert made.add_threshold is not None and not made.adds
    new, truth = _states(2000, 1.6, seed=1)
    assert FindingVerifier({"Pneumothorax": made}).supported(new) == [set()] * len(new)
    strong_x, strong_present = _states(400, 4.0)
    strong = fit_verifier(strong_x, [PTX if p else CLEAR for p in strong_present], ["Pneumothorax"]).checks[
        "Pneumothorax"
    ]
    assert strong.withholds and strong.adds and strong.add_fpr <= ADD_MAX_FPR == 0.05
    assert strong.sentences == ["There is a moderate right pneumothorax with a visible pleural line."]
    new, truth = _states(2000, 4.0, seed=1)
    called = np.array([bool(s) for s in FindingVerifier({"Pneumothorax": strong}).supported(new)])
    assert called[~truth].mean() <= 0.05 and called[truth].mean() > 0.8


def _confounded(n: int = 1000, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores of a readout at AUC about 0.93 on which films with a pleural effusion (30 % of those without the
    finding) score high as well: its old cut (0.2 cap) calls ~15 % of the films without the finding, ~35 % of
    those with an effusion."""
    rng = np.random.default_rng(seed)
    present = rng.random(n) < 0.3
    effusion = ~present & (rng.random(n) < 0.3)
    return rng.normal(size=n) + 2.6 * present + 1.2 * effusion, present, effusion


def test_the_add_cut_keeps_false_positives_within_5_percent_overall_and_10_percent_in_each_group():
    scores, present, effusion = _confounded()
    old = add_cut(scores, present, 0.2, ADD_MIN_PRECISION)  # the cut of the old rule
    overall, groups, _ = add_rates(scores, present, old, {"Pleural Effusion": effusion})
    assert 0.12 <= overall <= 0.2 and groups["Pleural Effusion"] >= 0.3
    cut = add_cut(scores, present, 0.05, ADD_MIN_PRECISION, groups={"Pleural Effusion": effusion})
    assert cut is not None and cut > old
    overall, groups, small = add_rates(scores, present, cut, {"Pleural Effusion": effusion})
    assert overall <= 0.05 and groups["Pleural Effusion"] <= 0.10 and small == []
    # the overall cap alone lets the effusion group through at more than 10 %: the group limit moved the cut
    alone = add_cut(scores, present, 0.05, ADD_MIN_PRECISION)
    assert add_rates(scores, present, alone, {"Pleural Effusion": effusion})[1]["Pleural Effusion"] > 0.10
    assert cut > alone
    # a group of fewer than MIN_GROUP_ROWS rows without the finding is held to the overall cap alone
    few = effusion & (np.cumsum(effusion) <= MIN_GROUP_ROWS - 1)
    assert add_cut(scores, present, 0.05, ADD_MIN_PRECISION, groups={"Pleural Effusion": few}) == alone
    assert add_rates(scores, present, alone, {"Pleural Effusion": few})[1:] == ({}, ["Pleural Effusion"])
    # films of a group that score as the positives do: no cut holds both limits, so the check adds nothing
    mimics = scores + 3.0 * effusion
    assert add_cut(mimics, present, 0.05, ADD_MIN_PRECISION, groups={"Pleural Effusion": effusion}) is None


def test_a_verifier_fitted_on_confounded_rows_adds_within_the_limits_or_not_at_all():
    scores, present, effusion = _confounded(seed=1)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(len(scores), 6))
    x[:, 0] = 2.0 * scores  # the state carries the readout's score and noise
    effusion_report = "Small left pleural effusion. No pneumothorax."
    reports = [PTX if p else effusion_report if e else CLEAR for p, e in zip(present, effusion, strict=True)]
    verifier = fit_verifier(x, reports, ["Pneumothorax"])
    check = verifier.checks["Pneumothorax"]
    assert check.cross_fitted_auc >= 0.9 and check.adds
    assert check.add_fpr <= 0.05 and check.add_group_fpr["Pleural Effusion"] <= 0.10
    assert set(check.add_group_fpr) == {"Pleural Effusion", "No Finding"}  # the groups the rows carry
    said = describe(verifier)["Pneumothorax"]
    assert said["adds"] and said["add_fpr"] == check.add_fpr and said["add_group_fpr"] == check.add_group_fpr
    # the same rows with a handful of fractures among those without the finding: too few to estimate, said so
    fractures = [i for i in np.flatnonzero(~present & ~effusion)[:5]]
    few = [("Healing rib fracture. " + r) if i in fractures else r for i, r in enumerate(reports)]
    said = describe(fit_verifier(x, few, ["Pneumothorax"]))["Pneumothorax"]
    assert said["add_groups_judged_overall_only"].startswith("Fracture: fewer than 20 rows")
    # 40 effusion films that read above the finding itself: the check still reads it at AUC >= 0.9 and withholds,
    # but no cut calls under 10 % of them, so it adds nothing
    mimic = effusion & (np.cumsum(effusion) <= 40)
    x[:, 0] = 2.0 * (scores - 1.2 * effusion + 6.0 * mimic)
    reports = [PTX if p else effusion_report if m else CLEAR for p, m in zip(present, mimic, strict=True)]
    check = fit_verifier(x, reports, ["Pneumothorax"]).checks["Pneumothorax"]
    assert check.cross_fitted_auc >= 0.9 and check.withholds
    assert (
        not check.adds
        and check.add_threshold is None
        and not describe(FindingVerifier({"Pneumothorax": check}))["Pneumothorax"]["adds"]
    )


def test_a_verifier_saved_before_the_false_positive_limits_withholds_but_never_adds(tmp_path):
    import json

    x, present = _states(300, 4.0)
    verifier = fit_verifier(x, [PTX if p else CLEAR for p in present], ["Pneumothorax"])
    saved = json.loads(verifier.save(tmp_path).read_text())
    for check in saved["checks"]:  # as written before issue 40: no measured rates
        for key in ("add_fpr", "add_group_fpr", "add_groups_too_small"):
            del check[key]
    (tmp_path / VERIFIER_FILE).write_text(json.dumps(saved))
    old = FindingVerifier.load(tmp_path)
    films = np.zeros((2, 6))
    films[0, 0] = 8.0
    assert old.checks["Pneumothorax"].add_threshold is not None and not old.checks["Pneumothorax"].adds
    assert old.supported(films) == [set(), set()] and old.unsupported(films) == [set(), {"Pneumothorax"}]
    assert verifier.supported(films) == [{"Pneumothorax"}, set()]


def test_the_sentences_a_check_adds_state_its_finding_alone_most_frequent_first():
    reports = [
        PTX,
        PTX,
        "Small left pneumothorax. Heart is enlarged.",
        "Pneumothorax and effusion on the right.",
        CLEAR,
    ]
    assert finding_sentences(reports, "Pneumothorax") == [
        "There is a moderate right pneumothorax with a visible pleural line.",
        "Small left pneumothorax.",
    ]
    assert finding_sentences(reports, "Pneumothorax", limit=1) == [
        "There is a moderate right pneumothorax with a visible pleural line."
    ]


def test_adding_a_finding_puts_its_sentence_in_the_findings_and_takes_its_denial_out():
    from orapo_core.facts.consistency import add_findings

    draft = "FINDINGS: Heart size is normal. No pleural effusion or pneumothorax.\n\nIMPRESSION: No acute process."
    text, added, dropped = add_findings(draft, {"Pneumothorax": "Small left pneumothorax."})
    # the impression no longer calls the study normal above a pneumothorax: it states the addition instead
    assert text == (
        "FINDINGS: Heart size is normal. No pleural effusion. Small left pneumothorax.\n\n"
        "IMPRESSION: Small left pneumothorax."
    )
    assert added == ["Small left pneumothorax."]
    assert dropped == ["No pleural effusion or pneumothorax.", "No acute process."]
    stated = "FINDINGS: Small right pneumothorax."
    assert add_findings(stated, {"Pneumothorax": "Small left pneumothorax."}) == (stated, [], [])  # said already
    assert add_findings("Heart is normal.", {"Fracture": "Healing rib fracture."}) == (
        "Heart is normal. Healing rib fracture.",
        ["Healing rib fracture."],
        [],
    )


def test_an_added_finding_takes_out_what_a_reader_would_see_it_contradict_and_joins_the_impression():
    from orapo_core.facts.consistency import add_findings

    clear = "FINDINGS: The lungs are clear. Heart size is normal.\n\nIMPRESSION: Normal chest radiograph."
    text, added, dropped = add_findings(clear, {"Lung Lesion": "A 2 cm nodule in the right upper lobe."})
    assert text == (
        "FINDINGS: Heart size is normal. A 2 cm nodule in the right upper lobe.\n\n"
        "IMPRESSION: A 2 cm nodule in the right upper lobe."
    )
    assert dropped == ["The lungs are clear.", "Normal chest radiograph."]  # a nodule is a lung opacity
    # clear lungs do not deny a pneumothorax, and an impression that states findings keeps them, numbered on
    listed = "FINDINGS: The lungs are clear. The heart is enlarged.\n\nIMPRESSION: 1. Cardiomegaly. 2. No effusion."
    text, _, dropped = add_findings(listed, {"Pneumothorax": "Small left pneumothorax."})
    assert text == (
        "FINDINGS: The lungs are clear. The heart is enlarged. Small left pneumothorax.\n\n"
        "IMPRESSION: 1. Cardiomegaly. 2. No effusion. 3. Small left pneumothorax."
    )
    assert dropped == []
    # a sentence about one part of the film is not one calling the study normal
    bones = "FINDINGS: Heart size is normal. No acute osseous abnormality.\n\nIMPRESSION: No acute disease."
    assert add_findings(bones, {"Pneumothorax": "Small left pneumothorax."})[2] == ["No acute disease."]
    # a list of denials keeps the others
    text, _, dropped = add_findings(
        "FINDINGS: No focal consolidation, pleural effusion, or pneumothorax.",
        {"Pneumothorax": "Small left pneumothorax."},
    )
    assert text == "FINDINGS: No consolidation or pleural effusion. Small left pneumothorax."
    assert dropped == ["No focal consolidation, pleural effusion, or pneumothorax."]
    # a draft without an impression does not get one
    assert add_findings("FINDINGS: Heart is normal.", {"Fracture": "Healing rib fracture."})[0] == (
        "FINDINGS: Heart is normal. Healing rib fracture."
    )


def test_taught_findings_are_those_corrections_added_often_enough():
    added = {"clinician_chosen": PTX, "clinician_rejected": CLEAR}
    already = {"clinician_chosen": PTX, "clinician_rejected": PTX}
    assert taught_findings([added] * 10 + [already] * 5) == ["Pneumothorax"]
    assert taught_findings([added] * 9 + [already] * 5) == []
    assert taught_findings([{"oracle_report": PTX}] * 20) == []  # replayed studies teach nothing


def test_the_verifier_round_trips_and_withholds_only_the_unsupported_findings_sentences(tmp_path):
    x, present = _states(300, 4.0)
    verifier = fit_verifier(x, [PTX if p else CLEAR for p in present], ["Pneumothorax"])
    verifier.save(tmp_path)
    again = FindingVerifier.load(tmp_path)
    assert again.checks["Pneumothorax"] == verifier.checks["Pneumothorax"]
    assert FindingVerifier.load(tmp_path / "nothing") is None
    films = np.zeros((2, 6))
    films[0, 0] = 8.0
    assert again.unsupported(films) == [set(), {"Pneumothorax"}]

    from orapo_core.facts.consistency import split_unsupported

    text, withheld = split_unsupported(PTX + " Heart size is normal.", {"Pneumothorax"})
    assert withheld == ["There is a moderate right pneumothorax with a visible pleural line."]
    assert text == "No pleural effusion. Heart size is normal."
    assert split_unsupported(CLEAR, {"Pneumothorax"}) == (CLEAR, [])  # a denial is never withheld


@pytest.mark.slow
def test_a_round_with_the_verifier_saves_it_and_its_drafts_withhold_what_it_does_not_support(tiny_model, tmp_path):
    pytest.importorskip("trl")
    import torch
    from PIL import Image

    from orapo_core.models.draft import Drafter
    from orapo_core.models.loading import load_model
    from orapo_core.models.verifier import VERIFIER_FILE, fit_round_verifier
    from orapo_core.train.dataset import build_training_dataset

    rows = []
    for i in range(24):
        path = tmp_path / f"{i}.png"
        Image.new("L", (56, 56), color=20 if i % 2 else 230).save(path)  # bright films carry the finding
        report = CLEAR if i % 2 else PTX
        rows.append(
            {
                "study_id": f"s{i}",
                "image": str(path),
                "labels": {},
                "reference_report": report,
                "oracle_report": report,
                "clinician_chosen": report,
                "clinician_rejected": CLEAR,
            }
        )
    dataset = build_training_dataset(rows)
    loaded = load_model(tiny_model)
    torch.manual_seed(0)
    verifier = fit_round_verifier(loaded.model, loaded.processor, dataset, min_taught=10)
    assert verifier is not None and set(verifier.checks) == {"Pneumothorax"}
    verifier.save(tmp_path)
    assert (tmp_path / VERIFIER_FILE).is_file()

    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model, model_dir)
    verifier.save(model_dir)
    drafter = Drafter.from_dir(model_dir)
    assert drafter.verifier is not None
    dark, bright = Image.new("RGB", (56, 56), (20,) * 3), Image.new("RGB", (56, 56), (230,) * 3)
    assert drafter.checked_findings([dark, bright])[0] == [{"Pneumothorax"}, set()]
    draft = drafter.compose(PTX, [], drafter.sampling_settings(samples=0), unsupported={"Pneumothorax"})
    assert draft.text == "No pleural effusion." and draft.withheld == [PTX.split(" No")[0]]
    assert draft.sampling["verified_findings"] == ["Pneumothorax"]
    # the bright film reads the finding: a draft silent on it gets the round's sentence stating it, the dark not
    assert drafter.checked_findings([dark, bright])[1] == [set(), {"Pneumothorax"}]
    silent, said = drafter.draft_many([dark, bright], samples=0, max_new_tokens=8)
    sentence = "There is a moderate right pneumothorax with a visible pleural line."
    assert sentence not in silent.text and silent.added == []
    assert said.text.endswith(sentence) and said.added == [sentence]
    # the app's running batch (the reading room's path) applies the same checks as draft_many
    from app.services.reading.draft_batcher import DraftBatcher

    assert drafter.new_decoder() is not None  # the tiny model decodes in a running batch, so finish() is the path
    batcher = DraftBatcher(drafter, max_wait_s=0.01)
    in_batch = batcher.draft(bright, samples=0, max_new_tokens=8)
    assert in_batch.text == said.text and in_batch.added == [sentence]
    assert batcher.draft(dark, samples=0, max_new_tokens=8).added == []
    batcher.close()


@pytest.mark.slow
def test_the_model_chooses_the_sentence_it_reads_most_easily(tiny_model):
    from PIL import Image

    from orapo_core.models.loading import load_model
    from orapo_core.models.scoring import answer_token_logps, best_continuation

    loaded = load_model(tiny_model)
    tokenizer = loaded.processor.tokenizer
    film = Image.new("RGB", (56, 56), (120,) * 3)
    prefix, candidates = (
        "FINDINGS: Heart is normal. ",
        ["Small left pneumothorax.", "Large right pneumothorax.", "There is a tiny apical pneumothorax on the left."],
    )
    means = []
    for text in candidates:  # each read alone, its own tokens after the prefix's
        head, whole = (
            tokenizer(prefix, add_special_tokens=False)["input_ids"],
            tokenizer(prefix + text, add_special_tokens=False)["input_ids"],
        )
        token, _, _ = answer_token_logps(loaded.model, loaded.processor, [film], [whole])
        means.append(float(token[0, len(head) :].mean()))
    assert best_continuation(loaded.model, loaded.processor, film, prefix, candidates) == int(np.argmax(means))
