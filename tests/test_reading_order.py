"""The worklist's ordering of unread studies: oldest first, or most useful to the model first (self-consistency of
the K samples, their disagreement on findings, and the findings the served model misses most), on literal drafts;
which ordering each correction came from, and how many of a round's pairs each ordering brought."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from orapo_core.errors import OrapoError

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def overview(study_id, *, status="drafted", minutes=0, text=None, sentences=None):
    study = SimpleNamespace(id=study_id, status=status, created_at=T0 + timedelta(minutes=minutes))
    draft = None if text is None else SimpleNamespace(text=text, sentence_scores=sentences)
    return SimpleNamespace(study=study, latest_draft=draft)


def sentence(confidence, *agreements):
    return {"text": "s", "confidence": confidence, "agreements": [{"agreement": a} for a in agreements]}


def test_usefulness_is_the_documented_formula_on_literal_numbers() -> None:
    from app.services.reading.reading_order import usefulness

    draft = overview(
        1,
        text="Findings: Small left pleural effusion. Heart size normal.",
        sentences=[sentence(0.5, 0.5), sentence(1.0, 1.0), {"text": "Impression.", "confidence": 1.0}],
    )
    rates = {"Pleural Effusion": 0.5, "Pneumothorax": 0.25, "Cardiomegaly": 0.1}
    u = usefulness(draft, rates)
    # sentences with facts: confidences 0.5 and 1.0; one of two facts disagreed on; effusion is stated, so the
    # most-missed finding it is silent on is pneumothorax.
    assert (u.inconsistency, u.disagreement, u.missed) == (0.25, 0.5, 0.25)
    assert u.score == pytest.approx(0.4 * 0.25 + 0.3 * 0.5 + 0.3 * 0.25)
    assert usefulness(overview(2), rates).score == 0  # no draft yet
    assert usefulness(overview(3, text="Findings: Clear.", sentences=[]), {}).score == 0


def test_useful_first_puts_the_least_sure_draft_first_and_keeps_ties_oldest_first(monkeypatch) -> None:
    from app.services.reading.reading_order import ordered

    sure = overview(1, minutes=0, text="Findings: Clear.", sentences=[sentence(1.0, 1.0)])
    unsure = overview(2, minutes=5, text="Findings: Possible effusion.", sentences=[sentence(0.25, 0.25)])
    undrafted_old = overview(3, status="new", minutes=-10)
    undrafted_new = overview(4, status="new", minutes=10)
    signed = overview(5, status="signed", minutes=-20, text="Findings: Clear.", sentences=[])
    newest_first = [undrafted_new, unsure, sure, undrafted_old, signed]
    db = None  # miss rates come from the database only when ordering by usefulness: see the next test
    assert [o.study.id for o in ordered(db, newest_first, "oldest first")] == [3, 1, 2, 4, 5]
    monkeypatch.setattr("app.services.reading.reading_order.signed_drafts", lambda db: [])
    monkeypatch.setattr("app.services.reading.reading_order.served_miss_rates", lambda db, signed=None: {})
    assert [o.study.id for o in ordered(db, newest_first, "most useful to the model first")] == [2, 3, 1, 4, 5]
    with pytest.raises(OrapoError) as exc:
        ordered(db, newest_first, "random")
    assert exc.value.code == "invalid_reading_order"


@pytest.fixture
def clinic(data_dir):
    from app.runtime import open_database
    from db import ModelVersionRepository, UserRepository
    from orapo_core.config import Settings
    from tests.support.rounds import uid_with_split

    settings = Settings()
    db = open_database(settings)
    rita = UserRepository(db).create("rita", "rita-pass-1")
    served = ModelVersionRepository(db).create("served", base_model_path="models/starter")
    ModelVersionRepository(db).promote(served.id)
    old = ModelVersionRepository(db).create("old", base_model_path="models/old")

    def study(tag: str, draft_text: str, *, version=served, report: str | None = None, features=None):
        from db import CorrectionRepository, DraftRepository, StudyRepository

        s = StudyRepository(db).create(uid_with_split(tag, "train"), f"ANON-{tag}", uploaded_by=rita.id)
        d = DraftRepository(db).create(
            s.id, model_name="m", prompt="p", text=draft_text, model_version_id=version.id, image_features=features
        )
        if report is not None:
            CorrectionRepository(db).create(s.id, author_id=rita.id, text=report, draft_id=d.id, signed=True)
        return s.id, d.id

    return SimpleNamespace(db=db, settings=settings, rita=rita, study=study, old=old)


def test_miss_rates_are_the_served_models_smoothed(clinic) -> None:
    from app.services.reading.reading_order import served_miss_rates

    clear = "Findings: The lungs are clear.\nImpression: Normal."
    effusion = "Findings: Small right pleural effusion.\nImpression: Effusion."
    clinic.study("a", clear, report=effusion)  # missed
    clinic.study("b", effusion, report=effusion)  # found
    clinic.study("c", clear, report="Findings: Right pneumothorax.\nImpression: Pneumothorax.", version=clinic.old)
    rates = served_miss_rates(clinic.db)
    assert rates == {"Pleural Effusion": pytest.approx(1 / 4)}  # 1 miss of 2 reports, + 2; the old model's not


def test_a_correction_records_the_ordering_it_was_opened_from(clinic) -> None:
    from app.services.reading import reading_order
    from app.services.reading.reports import save_report
    from app.services.rounds.data import select_round_studies
    from db import CorrectionRepository

    from_useful, draft_a = clinic.study("u", "Findings: Clear.\nImpression: Normal.")
    from_oldest, draft_b = clinic.study("o", "Findings: Clear.\nImpression: Normal.")
    uploaded, draft_c = clinic.study("x", "Findings: Clear.\nImpression: Normal.")
    assert reading_order.note_opened(clinic.db, clinic.rita, from_useful, "most useful to the model first")
    assert reading_order.note_opened(clinic.db, clinic.rita, from_oldest, "oldest")
    report = "Findings: Small left pleural effusion.\nImpression: Effusion."
    for study_id, draft_id in ((from_useful, draft_a), (from_oldest, draft_b), (uploaded, draft_c)):
        save_report(clinic.db, clinic.rita, study_id, draft_id, report, sign=True)
    orders = {c.study_id: c.reading_order for c in CorrectionRepository(clinic.db).untrained(signed_only=True)}
    assert orders == {from_useful: "useful", from_oldest: "oldest", uploaded: None}
    # Opening a signed study to amend it is not reading it in an ordering.
    assert not reading_order.note_opened(clinic.db, clinic.rita, from_oldest, "useful")

    for study_id in (from_useful, from_oldest, uploaded):  # the round needs an image to train on
        path = clinic.settings.storage_dir / f"seed/{study_id}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"png")
        from db import StudyRepository

        StudyRepository(clinic.db).add_image(
            study_id, display_path=f"seed/{study_id}.png", width=8, height=8, source_format="png"
        )
    summary = select_round_studies(clinic.db, clinic.settings).summary()
    assert summary.pairs_by_order == {"oldest": 1, "unordered": 1, "useful": 1}

    from app.tabs.rounds import pairs_by_order_text

    assert pairs_by_order_text(summary) == (
        "1 oldest first · 1 not opened from an ordering · 1 most useful to the model first"
    )


def test_the_database_refuses_an_unknown_ordering(clinic) -> None:
    from db import CorrectionRepository

    study_id, draft_id = clinic.study("z", "Findings: Clear.")
    with pytest.raises(OrapoError) as exc:
        CorrectionRepository(clinic.db).create(
            study_id, author_id=clinic.rita.id, text="x", draft_id=draft_id, reading_order="random"
        )
    assert exc.value.code == "invalid_reading_order"


def test_a_silent_drafts_missed_term_is_the_chance_its_film_holds_a_finding_the_model_misses() -> None:
    from app.services.reading.reading_order import MIN_EXEMPLARS, finding_resemblance, usefulness

    def draft(features, version=1):
        return SimpleNamespace(image_features=features, model_version_id=version, model_name="m", text="")

    ptx = {"Pneumothorax"}
    # two films a correction added a pneumothorax to, four signed without one (version 1's drafts)
    signed = [
        (draft([1.0, 0.0]), "", ptx, set()),
        (draft([0.8, 0.2]), "", ptx, set()),
        (draft([0.0, 1.0]), "", set(), set()),
        (draft([0.0, 0.8]), "", set(), set()),
        (draft([0.1, 0.9]), "", set(), set()),
        (draft([-0.1, 0.9]), "", set(), set()),
    ]
    odds = finding_resemblance(signed)[(1, None)]
    ptx_odds = odds.findings["Pneumothorax"]
    # centre (0, 0.9), direction (0.9, -0.8): projection 0 at the films without it, 1 at those it was added to
    assert ptx_odds.projection([0.0, 0.9]) == pytest.approx(0.0) and ptx_odds.projection([0.9, 0.1]) == pytest.approx(
        1.0
    )
    assert ptx_odds.added == 2 == MIN_EXEMPLARS
    near, middle, far = ptx_odds([0.9, 0.1]), ptx_odds([0.45, 0.5]), ptx_odds([0.0, 0.9])
    assert far < 0.2 < middle < near and near > 0.8  # calibrated on the six signed films
    assert odds.base == {"Pneumothorax": pytest.approx(3 / 8)}  # 2 of 6 signed reports, smoothed

    rates = {"Pneumothorax": 0.5, "Cardiomegaly": 0.2}

    def unread(features, version=1, text="Findings: The lungs are clear."):
        o = overview(9, text=text, sentences=[])
        o.latest_draft.image_features, o.latest_draft.model_version_id, o.latest_draft.model_name = (
            features,
            version,
            "m",
        )
        return usefulness(o, rates, {(1, None): odds}).missed

    # 1 - (1 - 0.5 P(ptx | image)) (1 - 0.2 P(cardiomegaly)), with cardiomegaly never signed here: P 0
    assert unread([0.9, 0.1]) == pytest.approx(0.5 * near)
    assert unread([0.0, 0.9]) == pytest.approx(0.5 * far)
    assert unread([0.9, 0.1], text="Findings: Large right pneumothorax.") == pytest.approx(0.0)  # stated: not missed
    # another model's features, none at all: the largest miss rate, as before image features
    assert unread([0.0, 0.9], version=2) == unread(None) == pytest.approx(0.5)
    # features of another width fall back to the finding's share of the signed reports
    assert unread([0.0, 0.9, 1.0]) == pytest.approx(0.5 * 3 / 8)
    # one film is not enough to compare with
    assert finding_resemblance(signed[1:]) == {}


def test_useful_first_brings_forward_the_unread_film_like_the_ones_readers_added_a_finding_to(clinic) -> None:
    from app.services.reading.reading_order import ordered
    from db import StudyRepository

    clear = "Findings: The lungs are clear.\nImpression: Normal."
    added = "Findings: Large right pneumothorax.\nImpression: Pneumothorax."
    clinic.study("p1", clear, report=added, features=[1.0, 0.0, 0.1])
    clinic.study("p2", clear, report=added, features=[0.9, 0.1, 0.0])
    clinic.study("n1", clear, report=clear, features=[0.0, 1.0, 0.0])
    clinic.study("n2", clear, report=clear, features=[0.1, 0.9, 0.1])
    older, _ = clinic.study("u1", clear, features=[0.1, 1.0, 0.0])  # unread, like the films without it
    newer, _ = clinic.study("u2", clear, features=[0.95, 0.05, 0.05])  # unread, like those it was added to
    unread = StudyRepository(clinic.db).list(status=["new", "drafted"], limit=100)
    assert [o.study.id for o in ordered(clinic.db, unread, "useful")][:2] == [newer, older]
    assert [o.study.id for o in ordered(clinic.db, unread, "oldest")][:2] == [older, newer]


def test_atypicality_scores_what_the_drafts_findings_do_not_explain_of_the_image() -> None:
    import numpy as np

    from app.services.insight.dashboard import stated_findings
    from app.services.reading.reading_order import MIN_ATYPICAL, image_atypicality

    rng = np.random.default_rng(0)
    cardiomegaly = "Findings: The heart is enlarged.\nImpression: Cardiomegaly."
    clear = "Findings: The lungs are clear.\nImpression: Normal."

    def unread(study_id, features, text):
        o = overview(study_id, text=text, sentences=[])
        o.latest_draft.image_features, o.latest_draft.model_version_id, o.latest_draft.model_name = features, 1, "m"
        return o

    def film(big_heart, extra=0.0):  # 6 features: the heart shows in the first, noise in all, `extra` in the last
        x = rng.normal(0, 0.1, 6)
        x[0] += 5.0 * big_heart
        x[5] += extra
        return list(x)

    ordinary = [unread(i, film(i % 10 == 0), cardiomegaly if i % 10 == 0 else clear) for i in range(30)]
    explained = unread(100, film(1), cardiomegaly)  # far from most films (4 of 31 big hearts), but its draft says why
    unexplained = unread(101, film(0, extra=1.0), clear)  # something the draft does not state
    other_model = unread(102, film(0, extra=1.0), clear)
    other_model.latest_draft.model_version_id = 2  # alone in its feature space: not scored
    scores = image_atypicality([*ordinary, explained, unexplained, other_model], [])
    assert scores[101] == 1.0  # the most atypical of the 32 unread drafts of model 1
    assert scores[100] < 0.9  # a big heart, stated in its draft, is no surprise
    assert 102 not in scores and len(scores) == 32 and min(scores.values()) == 0.0
    # signed drafts of the same model count towards the fit, but are not scored
    signed = [(o.latest_draft, "", set(), stated_findings(o.latest_draft.text)) for o in ordinary[: MIN_ATYPICAL - 2]]
    assert set(image_atypicality([explained, unexplained], signed)) == {100, 101}
    assert image_atypicality([explained, unexplained], signed[:-1]) == {}  # fewer than MIN_ATYPICAL drafts
    # findings the caller already labelled are used as given: said to state nothing, the big heart is a surprise
    alike = image_atypicality([*ordinary, explained, unexplained], [], {100: set()})
    assert alike[100] > scores[100] and alike[100] >= 0.9


def test_useful_first_reads_the_unexplained_film_first_before_any_correction(clinic) -> None:
    import numpy as np

    from app.services.reading.reading_order import MIN_ATYPICAL, ordered
    from db import StudyRepository

    rng = np.random.default_rng(1)
    clear = "Findings: The lungs are clear.\nImpression: Normal."
    for i in range(MIN_ATYPICAL):
        clinic.study(f"n{i}", clear, features=list(rng.normal(0, 0.1, 4)))
    odd, _ = clinic.study("odd", clear, features=[0.0, 0.0, 0.0, 2.0])  # the newest; nothing signed yet
    unread = StudyRepository(clinic.db).list(status=["new", "drafted"], limit=100)
    assert ordered(clinic.db, unread, "useful")[0].study.id == odd
    assert ordered(clinic.db, unread, "oldest")[-1].study.id == odd
