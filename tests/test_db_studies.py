"""Studies, images, drafts and corrections (with amendments), pairs and the dashboard."""

from __future__ import annotations

import pytest

from db.database import Database
from db.records import UserRecord
from db.repositories import (
    CorrectionRepository,
    DashboardRepository,
    DraftRepository,
    PairRepository,
    RoundRepository,
    StudyRepository,
    UserRepository,
    split_for,
)
from orapo_core.errors import OrapoError


def _uid(split: str, start: int = 0) -> str:
    """A study UID hash that falls in the given split."""
    return next(f"uid-{i}" for i in range(start, start + 10_000) if split_for(f"uid-{i}") == split)


@pytest.fixture
def alice(database: Database) -> UserRecord:
    return UserRepository(database).create("alice", "alice-password")


@pytest.fixture
def bob(database: Database) -> UserRecord:
    return UserRepository(database).create("bob", "bob-password")


def _study(database: Database, user: UserRecord, split: str = "train", start: int = 0, **kwargs):
    return StudyRepository(database).create(_uid(split, start), f"patient-{start}", uploaded_by=user.id, **kwargs)


def test_split_is_fixed_by_the_uid_hash_at_a_stable_fraction() -> None:
    assert split_for("abc") == split_for("abc")
    splits = [split_for(f"study-{i}") for i in range(4000)]
    assert 0.07 < splits.count("holdout") / len(splits) < 0.13
    assert split_for("abc", holdout_fraction=0.0) == "train" and split_for("abc", holdout_fraction=1.0) == "holdout"


def test_study_and_images(database: Database, alice: UserRecord) -> None:
    studies = StudyRepository(database)
    study = studies.create(
        _uid("train"),
        "patient-a",
        view_position="PA",
        modality="DX",
        laterality=None,
        body_part="CHEST",
        uploaded_by=alice.id,
    )
    assert (study.status, study.split, study.view_position, study.uploaded_by) == ("new", "train", "PA", alice.id)
    assert study.created_at.tzinfo is not None
    held_out = studies.create(_uid("holdout"), "patient-b", uploaded_by=alice.id)
    assert held_out.split == "holdout"
    image = studies.add_image(
        study.id,
        display_path="ab/cd.png",
        dicom_path="ab\\cd.dcm",
        width=2048,
        height=2500,
        bits_stored=12,
        source_format="dicom",
        warnings=["burned-in text?"],
        header={"Modality": "DX"},
    )
    assert (image.display_path, image.dicom_path, image.warnings, image.header) == (
        "ab/cd.png",
        "ab/cd.dcm",
        ["burned-in text?"],
        {"Modality": "DX"},
    )
    assert studies.images(study.id) == [image] and studies.get_image(image.id) == image
    assert studies.find_by_uid_hash(study.study_uid_hash) == study and studies.find_by_uid_hash("nope") is None
    for bad in ("/etc/passwd", "../outside.png", "a/../../b.png", "C:\\x.png"):
        with pytest.raises(OrapoError) as refused:
            studies.add_image(study.id, display_path=bad, width=1, height=1, source_format="png")
        assert refused.value.code == "bad_image_path"
    with pytest.raises(OrapoError) as refused:
        studies.create(study.study_uid_hash, "patient-a")
    assert refused.value.code == "study_exists"
    with pytest.raises(OrapoError):
        studies.get(9999)


def test_draft_correction_amendment_flow(database: Database, alice: UserRecord, bob: UserRecord) -> None:
    study = _study(database, alice)
    draft = DraftRepository(database).create(
        study.id,
        model_name="starter",
        prompt="Describe the chest X-ray.",
        text="No acute findings.",
        sampling={"temperature": 0.0},
        facts=[{"finding": "no_finding"}],
        sentence_scores=[0.9],
        latency_ms=120,
        created_by=alice.id,
    )
    assert StudyRepository(database).get(study.id).status == "drafted"
    corrections = CorrectionRepository(database)
    first = corrections.create(
        study.id, author_id=alice.id, draft_id=draft.id, text="No  acute findings. ", labels={"no_finding": 1}
    )
    assert (first.version, first.previous_id, first.accepted_unchanged, first.signed_at) == (1, None, True, None)
    assert StudyRepository(database).get(study.id).status == "corrected"
    with pytest.raises(OrapoError) as refused:
        corrections.create(study.id, author_id=alice.id, draft_id=draft.id, text="again")
    assert refused.value.code == "correction_exists"

    signed = corrections.sign(first.id)
    assert signed.signed_at is not None and StudyRepository(database).get(study.id).status == "signed"
    with pytest.raises(OrapoError):
        corrections.sign(first.id)

    amended = corrections.amend(first.id, author_id=bob.id, text="Small right pleural effusion.", signed=True)
    assert (amended.version, amended.previous_id, amended.accepted_unchanged, amended.labels) == (
        2,
        first.id,
        False,
        {"no_finding": 1},
    )
    with pytest.raises(OrapoError) as refused:
        corrections.amend(first.id, author_id=bob.id, text="forked")
    assert refused.value.code == "stale_correction"
    history = corrections.history(study.id)
    assert [(c.version, c.text) for c in history] == [(1, "No  acute findings. "), (2, "Small right pleural effusion.")]
    assert history[0] == signed  # the first version is untouched by the amendment
    assert corrections.latest_for_study(study.id) == amended


def test_correction_refuses_a_draft_of_another_study(database: Database, alice: UserRecord) -> None:
    one, other = _study(database, alice, start=0), _study(database, alice, start=5000)
    draft = DraftRepository(database).create(one.id, model_name="m", prompt="p", text="t")
    with pytest.raises(OrapoError) as refused:
        CorrectionRepository(database).create(other.id, author_id=alice.id, draft_id=draft.id, text="x")
    assert refused.value.code == "draft_not_found"


def test_worklist_by_user_and_status_with_latest_draft_and_correction(
    database: Database, alice: UserRecord, bob: UserRecord
) -> None:
    studies, drafts, corrections = StudyRepository(database), DraftRepository(database), CorrectionRepository(database)
    a1 = _study(database, alice, start=0)
    a2 = _study(database, alice, start=5000)
    b1 = _study(database, bob, start=10000)
    studies.add_image(a1.id, display_path="a1.png", width=4, height=4, source_format="png")
    drafts.create(a1.id, model_name="m", prompt="p", text="old draft")
    newest = drafts.create(a1.id, model_name="m", prompt="p", text="new draft")
    v1 = corrections.create(a1.id, author_id=alice.id, draft_id=newest.id, text="v1")
    v2 = corrections.amend(v1.id, author_id=alice.id, text="v2")
    drafts.create(b1.id, model_name="m", prompt="p", text="bob's draft")

    mine = studies.list(uploaded_by=alice.id)
    assert [o.study.id for o in mine] == [a2.id, a1.id]  # newest first
    by_id = {o.study.id: o for o in mine}
    assert by_id[a1.id].latest_draft == newest and by_id[a1.id].latest_correction == v2
    assert [i.display_path for i in by_id[a1.id].images] == ["a1.png"]
    assert by_id[a2.id].latest_draft is None and by_id[a2.id].latest_correction is None
    assert [o.study.id for o in studies.list(status="drafted")] == [b1.id]
    assert {o.study.id for o in studies.list(status=["new", "corrected"])} == {a1.id, a2.id}
    assert studies.list(uploaded_by=bob.id, status="new") == []
    assert studies.overview(a1.id) == by_id[a1.id]
    with pytest.raises(OrapoError):
        studies.list(status="lost")


def test_untrained_corrections_exclude_holdout_unsigned_and_superseded(database: Database, alice: UserRecord) -> None:
    corrections = CorrectionRepository(database)
    train_a, train_b = _study(database, alice, "train", 0), _study(database, alice, "train", 5000)
    holdout = _study(database, alice, "holdout", 0)
    unsigned = _study(database, alice, "train", 10000)
    a1 = corrections.create(train_a.id, author_id=alice.id, text="a1", signed=True)
    a2 = corrections.amend(a1.id, author_id=alice.id, text="a2", signed=True)
    b1 = corrections.create(train_b.id, author_id=alice.id, text="b1", signed=True)
    h1 = corrections.create(holdout.id, author_id=alice.id, text="h1", signed=True)
    u1 = corrections.create(unsigned.id, author_id=alice.id, text="u1")

    assert [c.id for c in corrections.untrained()] == [a2.id, b1.id]
    assert [c.id for c in corrections.untrained(signed_only=False)] == [a2.id, b1.id, u1.id]
    assert corrections.count_untrained() == 2

    round_ = RoundRepository(database).create()
    with pytest.raises(OrapoError) as refused:
        corrections.mark_trained([b1.id, h1.id], round_.id)
    assert refused.value.code == "holdout_study"
    assert corrections.get(b1.id).trained_in_round is None  # nothing half-done
    assert corrections.mark_trained([b1.id, a2.id], round_.id) == 2
    assert corrections.untrained() == []
    assert StudyRepository(database).get(train_b.id).status == "trained"


def test_pairs(database: Database, alice: UserRecord) -> None:
    study = _study(database, alice)
    image = StudyRepository(database).add_image(study.id, display_path="x.png", width=2, height=2, source_format="png")
    correction = CorrectionRepository(database).create(study.id, author_id=alice.id, text="Effusion.", signed=True)
    pairs = PairRepository(database)
    edit = pairs.add(
        study.id,
        image_id=image.id,
        prompt="p",
        chosen="Effusion.",
        rejected="Normal.",
        source="clinician_edit",
        correction_id=correction.id,
    )
    oracle = pairs.add_many(
        [
            dict(
                study_id=study.id,
                prompt="p",
                chosen="Effusion. Cardiomegaly.",
                rejected="Effusion.",
                source="oracle_step",
                correction_id=correction.id,
            )
        ]
    )[0]
    assert (edit.source, edit.image_id, edit.round_id) == ("clinician_edit", image.id, None)
    assert pairs.count() == 2 and pairs.count(source="oracle_step") == 1
    assert [p.id for p in pairs.list(source="clinician_edit")] == [edit.id]
    round_ = RoundRepository(database).create()
    assert pairs.assign_to_round([edit.id], round_.id) == 1
    assert [p.id for p in pairs.list(round_id=round_.id)] == [edit.id]
    assert [p.id for p in pairs.list(unassigned=True)] == [oracle.id]
    for kwargs, code in [
        (dict(study_id=study.id, prompt="p", chosen="a", rejected="b", source="guess"), "invalid_pair_source"),
        (dict(study_id=study.id, prompt="p", chosen="a", rejected="a", source="oracle_step"), "invalid_pair"),
        (
            dict(
                study_id=_study(database, alice, "holdout").id,
                prompt="p",
                chosen="a",
                rejected="b",
                source="oracle_step",
            ),
            "holdout_study",
        ),
        (dict(study_id=99999, prompt="p", chosen="a", rejected="b", source="oracle_step"), "study_not_found"),
    ]:
        with pytest.raises(OrapoError) as refused:
            pairs.add_many([kwargs])
        assert refused.value.code == code
    assert pairs.count() == 2


def test_dashboard_counts(database: Database, alice: UserRecord) -> None:
    empty = DashboardRepository(database).counts()
    assert (empty.studies, empty.corrections, empty.pairs, empty.accepted_unchanged_rate) == (0, 0, 0, None)

    corrections, drafts = CorrectionRepository(database), DraftRepository(database)
    s1, s2, s3 = (_study(database, alice, start=i) for i in (0, 5000, 10000))
    h = _study(database, alice, "holdout")
    _study(database, alice, start=15000)  # stays new
    d1 = drafts.create(s1.id, model_name="m", prompt="p", text="Normal.")
    d2 = drafts.create(s2.id, model_name="m", prompt="p", text="Normal.")
    drafts.create(s3.id, model_name="m", prompt="p", text="Normal.")
    c1 = corrections.create(s1.id, author_id=alice.id, draft_id=d1.id, text="Normal.", signed=True)  # accepted
    corrections.amend(c1.id, author_id=alice.id, text="Effusion.", signed=True)  # ... then amended: not accepted
    corrections.create(s2.id, author_id=alice.id, draft_id=d2.id, text="Normal.", signed=True)  # accepted
    corrections.create(h.id, author_id=alice.id, text="Holdout report.", signed=True)
    PairRepository(database).add(s1.id, prompt="p", chosen="Effusion.", rejected="Normal.", source="clinician_edit")

    counts = DashboardRepository(database).counts()
    assert counts.studies == 5 and counts.holdout_studies == 1
    assert counts.studies_by_status == {"new": 1, "drafted": 1, "corrected": 0, "signed": 3, "trained": 0}
    assert counts.corrections == 4 and counts.signed_corrections == 3 and counts.untrained_corrections == 2
    assert counts.pairs == 1 and counts.pairs_by_source == {"clinician_edit": 1}
    assert counts.accepted_unchanged_rate == pytest.approx(1 / 3)


def test_an_archive_link_is_kept_once_and_only_for_the_archives_own_study(
    database: Database, alice: UserRecord, tmp_path
) -> None:
    from app.services.archive.pacs import link_to_archive
    from db.repositories import ArchiveLinkRepository
    from orapo_core.config import Settings
    from orapo_core.imaging.deid import hashed_uid, unseal_archive_uid

    settings = Settings(data_dir=tmp_path, deid_secret="link-test-secret")
    archived = "1.2.3.4.5.6"
    study = StudyRepository(database).create(hashed_uid(settings.secret(), archived), "p", uploaded_by=alice.id)
    other = _study(database, alice)
    assert link_to_archive(database, settings, study.id, archived, source="dicomweb")
    assert not link_to_archive(database, settings, other.id, archived, source="dimse")  # not made from it
    assert not link_to_archive(database, settings, study.id, "", source="dimse")
    links = ArchiveLinkRepository(database)
    assert links.sealed(other.id) is None
    sealed = links.sealed(study.id)
    assert archived not in sealed and unseal_archive_uid(settings.secret(), sealed) == archived
    links.link(study.id, "a later token", source="dimse")  # the first link stands
    assert links.sealed(study.id) == sealed
