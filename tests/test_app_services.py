"""The app's services without a browser: sign-in, roles, drafting with a tiny model, reports and the worklist."""

from __future__ import annotations

import shutil

import pytest

from orapo_core.errors import OrapoError
from tests.support.dicom import pydicom_data_file


@pytest.fixture
def app_env(tmp_path, tiny_model):
    """(settings, db, boss, rita, omar): the app tests' data folder serving the tiny model."""
    from db import UserRepository
    from tests.support.app import make_env

    settings, db = make_env(tmp_path, tiny_model)
    users = UserRepository(db)
    return (settings, db, *(users.get_by_username(name) for name in ("boss", "rita", "omar")))


def _train_study(db, user, text="There is a small right pleural effusion. No pneumothorax."):
    """A training-split study with a stored draft (the split is a hash of the UID: pick one that trains)."""
    from db import DraftRepository, StudyRepository
    from db.repositories.studies import split_for

    uid = next(f"uid-{i}" for i in range(100) if split_for(f"uid-{i}") == "train")
    study = StudyRepository(db).create(uid, "ANON-1", uploaded_by=user.id)
    draft = DraftRepository(db).create(
        study.id,
        model_name="tiny",
        prompt="Describe.",
        text=text,
        sentence_scores=[
            {"text": "There is a small right pleural effusion.", "confidence": 0.4},
            {"text": "No pneumothorax.", "confidence": 1.0},
        ],
    )
    return study, draft


def test_sign_in_checks_the_users_table(app_env):
    from app.services.accounts.auth import check_credentials
    from db import UserRepository

    settings, db, admin, rad, other = app_env
    assert check_credentials(db, "rita", "rita-pass-1")
    assert not check_credentials(db, "rita", "wrong-password")
    assert not check_credentials(db, "nobody", "rita-pass-1")
    UserRepository(db).disable("rita")
    assert not check_credentials(db, "rita", "rita-pass-1")


def test_signed_in_enforces_active_role_and_password_change(app_env):
    from app.services.accounts.auth import signed_in
    from db import UserRepository

    settings, db, admin, rad, other = app_env
    assert signed_in(db, "boss", role="admin").id == admin.id
    assert signed_in(db, "boss", role="radiologist").id == admin.id  # an admin may read too
    with pytest.raises(OrapoError) as refused:
        signed_in(db, "rita", role="admin")
    assert refused.value.code == "forbidden"
    with pytest.raises(OrapoError) as nobody:
        signed_in(db, None)
    assert nobody.value.code == "not_signed_in"
    fresh, password = UserRepository(db).create_with_one_time_password("newbie")
    with pytest.raises(OrapoError) as must_change:
        signed_in(db, "newbie")
    assert must_change.value.code == "password_change_required"
    assert signed_in(db, "newbie", allow_password_change=True).username == "newbie"
    UserRepository(db).disable("rita")
    with pytest.raises(OrapoError) as disabled:
        signed_in(db, "rita")  # a session opened before the account was disabled
    assert disabled.value.code == "user_disabled"


def test_admin_services_refuse_a_radiologist_and_work_for_an_admin(app_env):
    from app.services.accounts import auth
    from db import AuditRepository, UserRepository

    settings, db, admin, rad, other = app_env
    for call in (
        lambda: auth.list_users(db, rad),
        lambda: auth.create_user(db, rad, "mallory", "admin"),
        lambda: auth.set_user_active(db, rad, "boss", False),
        lambda: auth.reset_password(db, rad, "boss"),
        lambda: auth.audit_log(db, rad),
    ):
        with pytest.raises(OrapoError) as refused:
            call()
        assert refused.value.code == "forbidden"
    assert [u.username for u in UserRepository(db).list()] == ["boss", "omar", "rita"]
    user, password = auth.create_user(db, admin, "nina", "radiologist")
    assert user.must_change_password and len(password) >= 12
    auth.change_own_password(db, user, password, "nina-new-pass", "nina-new-pass")
    assert not UserRepository(db).get_by_username("nina").must_change_password
    with pytest.raises(OrapoError):
        auth.set_user_active(db, admin, "boss", False)  # not oneself
    assert [e.action for e in auth.audit_log(db, admin, action="user.")][:2] == ["user.password", "user.create"]
    assert AuditRepository(db).query(actor_name="boss", action="user.create")


@pytest.mark.slow
def test_upload_draft_and_sign_through_the_services(app_env, tmp_path):
    from app.services.reading import drafting, reports
    from db import AuditRepository, CorrectionRepository, DraftRepository, PairRepository, StudyRepository

    settings, db, admin, rad, other = app_env
    upload = tmp_path / "cache" / "abc123" / "RG1_J2KR.dcm"
    upload.parent.mkdir(parents=True)
    shutil.copy(pydicom_data_file("RG1_J2KR.dcm"), upload)
    outcome = drafting.ingest_upload(db, settings, rad, upload)
    assert outcome.ok, outcome.message
    assert not upload.exists() and not upload.parent.exists()  # the original is gone from the cache

    overview = drafting.open_study(db, rad, outcome.study_id)
    view = drafting.viewer_pixels(settings, overview.images[0])
    assert view.pixels.dtype != "uint8" and view.pixels.max() > 255  # full bit depth, not the PNG
    lung = drafting.preset(view, "lung")
    assert lung != drafting.preset(view, "bone")
    assert drafting.render(view, *lung, zoom=2.0).shape == (view.pixels.shape[0] // 2, view.pixels.shape[1] // 2)

    settings = settings.model_copy(update={"draft_min_agreement": 0.5})  # a site that drafts at 2 of 4
    registry = drafting.ModelRegistry(settings, db)
    steps = []
    draft = drafting.draft_study(
        db, settings, registry, rad, outcome.study_id, samples=2, progress=lambda f, desc: steps.append(f)
    )
    assert draft.text and draft.model_name == settings.model_dir.name and draft.created_by == rad.id
    assert steps == sorted(steps) and len(steps) >= 3
    # drafted at the app's operating point (ORAPO_DRAFT_MIN_AGREEMENT), what it left out kept with the draft
    assert draft.sampling["min_agreement"] == settings.draft_min_agreement > 0
    assert isinstance(draft.facts["withheld"], list)
    assert registry.drafter(registry.served()) is registry.drafter(registry.served())  # loaded once
    assert StudyRepository(db).get(outcome.study_id).status == "drafted"
    # what the language model was shown of the image is kept with the draft, for the worklist's ordering
    merger = registry.drafter(registry.served()).loaded.model.model.visual.merger
    stored = StudyRepository(db).overview(outcome.study_id).latest_draft.image_features
    assert stored is not None and len(stored) == merger.mlp[-1].out_features and any(stored)

    with pytest.raises(OrapoError) as foreign:
        drafting.draft_study(db, settings, registry, other, outcome.study_id)
    assert foreign.value.code == "forbidden"

    if draft.problems:  # the tiny random model may write a sentence twice: Accept unchanged is refused for that
        with pytest.raises(OrapoError) as flawed:
            reports.accept_draft(db, rad, outcome.study_id, draft.id, draft.text)
        assert flawed.value.code == "draft_has_problems"
        draft = DraftRepository(db).create(
            outcome.study_id,
            model_name=draft.model_name,
            prompt=draft.prompt,
            text="No acute process.",
            created_by=rad.id,
        )
    signed = reports.accept_draft(db, rad, outcome.study_id, draft.id, draft.text)
    assert signed.accepted_unchanged and signed.signed_at is not None and signed.version == 1
    assert PairRepository(db).count() == 0  # nothing to learn from an accepted draft
    assert CorrectionRepository(db).latest_for_study(outcome.study_id).author_id == rad.id
    actions = [e.action for e in AuditRepository(db).query(object_type="study", object_id=outcome.study_id)]
    assert actions[:3] == ["correction.sign", "correction.create", "draft.create"] and "study.ingest" in actions


def test_an_edit_becomes_a_pair_and_an_amendment_a_new_version(app_env):
    from app.services.reading import reports, worklist
    from db import CorrectionRepository, PairRepository, StudyRepository

    settings, db, admin, rad, other = app_env
    study, draft = _train_study(db, rad)
    edited = "No pleural effusion. No pneumothorax."
    first = reports.save_report(db, rad, study.id, draft.id, edited, sign=False)
    assert (first.version, first.signed_at, first.accepted_unchanged) == (1, None, False)
    assert first.labels["Pleural Effusion"] == 0
    pair = PairRepository(db).list()[0]
    assert (pair.chosen, pair.rejected, pair.source, pair.correction_id) == (
        edited,
        draft.text,
        "clinician_edit",
        first.id,
    )

    signed = reports.save_report(db, rad, study.id, draft.id, edited, sign=True)
    assert signed.id == first.id and signed.signed_at is not None  # signing the saved text adds no version
    assert PairRepository(db).count() == 1
    assert StudyRepository(db).get(study.id).status == "signed"

    amended = reports.save_report(db, rad, study.id, draft.id, edited + " Heart size is normal.", sign=True)
    assert amended.version == 2 and amended.previous_id == first.id
    assert [c.text for c in CorrectionRepository(db).history(study.id)] == [edited, edited + " Heart size is normal."]
    h = worklist.history(db, rad, study.id)
    assert [d.id for d in h.drafts] == [draft.id] and len(h.corrections) == 2
    with pytest.raises(OrapoError) as empty:
        reports.save_report(db, rad, study.id, draft.id, "   ", sign=True)
    assert empty.value.code == "empty_report"


def test_accepting_an_edited_report_is_refused_and_the_signed_text_is_the_text_given(app_env):
    from app.services.reading import reports
    from db import AuditRepository, CorrectionRepository

    settings, db, admin, rad, other = app_env
    study, draft = _train_study(db, rad)
    edited = "No pleural effusion. No pneumothorax."
    with pytest.raises(OrapoError) as direct:  # the text on screen is not the draft: never sign the draft instead
        reports.accept_draft(db, rad, study.id, draft.id, edited)
    assert direct.value.code == "draft_edited"
    with pytest.raises(OrapoError) as asked:
        reports.prepare_report(db, rad, study.id, draft.id, edited, sign=True, accept=True)
    assert asked.value.code == "draft_edited"
    assert CorrectionRepository(db).history(study.id) == []  # nothing was stored, nothing was signed
    assert not AuditRepository(db).query(action="correction.sign", object_type="study", object_id=study.id)

    with pytest.raises(OrapoError) as foreign:  # someone else's study: refused before the draft is compared
        reports.prepare_report(db, other, study.id, draft.id, draft.text, sign=True, accept=True)
    assert foreign.value.code == "forbidden"

    on_screen = f"  {edited}\n"
    pending = reports.prepare_report(db, rad, study.id, draft.id, on_screen, sign=True)
    assert (pending.text, pending.sign, pending.accept, pending.base_version, pending.base_signed) == (
        edited,
        True,
        False,
        0,
        False,
    )
    assert pending.needs_confirmation and "amendment" not in pending.question()
    with pytest.raises(OrapoError) as changed:  # the report changed under the confirmation: store nothing
        reports.store_report(db, rad, pending, edited + " Heart size is normal.")
    assert changed.value.code == "report_changed"
    signed = reports.store_report(db, rad, pending, on_screen)
    assert (signed.text, signed.signed_at is not None, signed.accepted_unchanged, signed.previous_id) == (
        edited,
        True,
        False,
        None,
    )
    assert CorrectionRepository(db).latest_for_study(study.id).text == edited
    with pytest.raises(OrapoError) as twice:  # a second click on the same confirmation amends nothing
        reports.store_report(db, rad, pending, on_screen)
    assert twice.value.code == "stale_correction"

    # the draft back on screen, with different spacing, may be accepted: the signed text is the one given
    spaced = draft.text.replace(". ", ".  ")
    again = reports.prepare_report(db, rad, study.id, draft.id, spaced, sign=True, accept=True)
    assert again.base_signed and "This creates an amendment of the signed report" in again.question()
    amended = reports.store_report(db, rad, again, spaced)
    assert (amended.text, amended.accepted_unchanged, amended.version, amended.previous_id) == (
        spaced,
        True,
        2,
        signed.id,
    )


def test_an_unsigned_save_that_amends_a_signed_report_asks_first(app_env):
    from app.services.reading import reports

    settings, db, admin, rad, other = app_env
    study, draft = _train_study(db, rad)
    first = reports.save_report(db, rad, study.id, draft.id, "No pleural effusion.", sign=False)
    plain = reports.prepare_report(db, rad, study.id, draft.id, "No pleural effusion. No pneumothorax.", sign=False)
    assert (plain.base_version, plain.base_signed, plain.needs_confirmation) == (1, False, False)
    reports.save_report(db, rad, study.id, draft.id, first.text, sign=True)
    amending = reports.prepare_report(db, rad, study.id, draft.id, "No pleural effusion. No pneumothorax.", sign=False)
    assert (amending.base_version, amending.base_signed, amending.needs_confirmation) == (1, True, True)
    assert "amendment of the signed report" in amending.question()


def test_highlights_before_and_after_editing(app_env):
    from app.services.reading import highlights

    settings, db, admin, rad, other = app_env
    study, draft = _train_study(db, rad)
    before = highlights.highlights_for(draft, draft.text)
    assert before.mode == "confidence"
    assert [label for _, label in before.spans if label] == ["confidence 0.40", "confidence 1.00"]
    after = highlights.highlights_for(
        draft, "No pleural effusion. No pneumothorax. Consolidation in the left lower lobe."
    )
    assert [label for _, label in after.spans if label] == ["✗ contradicted", "✓ entailed"]
    assert after.missed == ["Consolidation"]
    rows = highlights.sentence_facts(draft.text, 0, "No pleural effusion.")
    assert rows == [
        [
            "pleural effusion",
            "Pleural Effusion",
            "positive",
            "laterality=right, severity=small",
            "contradicted (pleural effusion: stated in the draft, denied in the report)",
        ]
    ]
    assert after.reasons == [
        ("There is a small right pleural effusion.", "pleural effusion: stated in the draft, denied in the report")
    ]
    # the Read tab's rescore, by the stored draft's id: the same highlights as from the record
    assert highlights.rescore(db, draft.id, draft.text) == before
    assert (
        highlights.rescore(db, draft.id, "No pleural effusion. No pneumothorax. Consolidation in the left lower lobe.")
        == after
    )


def test_what_the_drafter_left_out_is_shown_before_and_after_editing(app_env):
    from app.services.reading import highlights
    from app.tabs.read_report import _missed_md
    from db import DraftRepository

    settings, db, admin, rad, other = app_env
    study, _ = _train_study(db, rad)
    draft = DraftRepository(db).create(
        study.id,
        model_name="tiny",
        prompt="Describe.",
        text="No pneumothorax.",
        sentence_scores=[{"text": "No pneumothorax.", "confidence": 1.0}],
        facts={"flagged": [], "withheld": ["Small right pneumothorax."]},
    )
    before = highlights.highlights_for(draft, draft.text)
    after = highlights.highlights_for(draft, "Small right pneumothorax.")
    assert before.withheld == after.withheld == ["Small right pneumothorax."]
    assert "Left out of the draft" in _missed_md(before) and "*Small right pneumothorax.*" in _missed_md(after)
    plain = highlights.highlights_for(
        DraftRepository(db).create(study.id, model_name="tiny", prompt="Describe.", text="No pneumothorax."), None
    )
    assert plain.withheld == [] and "Left out" not in _missed_md(plain)
    # a sentence the version's finding check put in is named as such, before and after editing
    checked = DraftRepository(db).create(
        study.id,
        model_name="tiny",
        prompt="Describe.",
        text="Heart is normal. Small right pneumothorax.",
        facts={"flagged": [], "withheld": [], "added": ["Small right pneumothorax."]},
    )
    for shown in (highlights.highlights_for(checked, None), highlights.highlights_for(checked, "Heart is normal.")):
        assert shown.added == ["Small right pneumothorax."]
        assert "Added by the finding check" in _missed_md(shown) and "*Small right pneumothorax.*" in _missed_md(shown)
    assert "Added by the finding check" not in _missed_md(plain)


def test_confidence_and_verdict_highlights_speak_different_languages(app_env):
    """Before editing a number on blue, after editing a symbol on green/red/grey: no label, colour or title shared."""
    from app.services.reading import highlights

    settings, db, admin, rad, other = app_env
    study, draft = _train_study(db, rad)  # "There is a small right pleural effusion." 0.4, "No pneumothorax." 1.0
    before = highlights.highlights_for(draft, draft.text)
    after = highlights.highlights_for(draft, "Large left pleural effusion. No pneumothorax.")
    labels_before = {label for _, label in before.spans if label}
    labels_after = {label for _, label in after.spans if label}
    assert labels_after == {"✗ contradicted: side, severity", "✓ entailed"}
    assert not labels_before & labels_after and not set(before.color_map.values()) & set(after.color_map.values())
    assert set(before.color_map) == labels_before and set(after.color_map) == labels_after
    assert before.color_map["confidence 0.40"] != before.color_map["confidence 1.00"]  # darker where less sure
    assert before.title != after.title and "confidence" in before.title and "verdict" in after.title
    # each mode's legend names its own colours, and only those
    assert {c for _, c, _ in before.legend()} == {c for _, c, _ in highlights.CONFIDENCE_BANDS}
    assert {label for label, _, _ in after.legend()} == {"✓ entailed", "✗ contradicted", "? unsupported", "− removed"}
    assert not {c for _, c, _ in before.legend()} & set(highlights.COLOR_MAP.values())
    # every verdict label a sentence can get has its colour in the static map the panel starts with
    assert set(after.color_map.items()) <= set(highlights.COLOR_MAP.items())
    # the reason is under the panel and in the facts table, word for word
    assert after.reasons == [
        (
            "There is a small right pleural effusion.",
            "side: right in the draft, left in the report; severity: small in the draft, large in the report",
        )
    ]
    rows = highlights.sentence_facts(draft.text, 0, "Large left pleural effusion. No pneumothorax.")
    assert rows == [
        [
            "pleural effusion",
            "Pleural Effusion",
            "positive",
            "laterality=right, severity=small",
            "contradicted (side: right in the draft, left in the report; "
            "severity: small in the draft, large in the report)",
        ]
    ]
    # a device of another type
    device = highlights.facts_highlights(
        "Right IJ central line. No pneumothorax.", "Endotracheal tube in place. No pneumothorax."
    )
    assert [label for _, label in device.spans if label] == ["✗ contradicted: device", "✓ entailed"]
    # a sentence without a finding gets no badge, and an empty draft panel is titled as such
    neutral = highlights.facts_highlights("Portable AP view. No pneumothorax.", "Portable AP view. No pneumothorax.")
    assert [label for _, label in neutral.spans] == [None, None, "✓ entailed"]  # nothing to check in the view
    deleted = highlights.facts_highlights("Portable AP view. No pneumothorax.", "No pneumothorax.")
    assert [label for _, label in deleted.spans] == ["− removed", None, "✓ entailed"]  # but its deletion shows
    assert highlights.facts_highlights("No pneumothorax.", "").title == highlights.TITLES["empty"]


def test_worklist_scopes_and_filters(app_env):
    from app.services.reading import drafting, worklist

    settings, db, admin, rad, other = app_env
    mine, draft = _train_study(db, rad)
    from db import StudyRepository

    theirs = StudyRepository(db).create("another-uid", "ANON-2", uploaded_by=other.id)
    assert [o.study.id for o in worklist.worklist(db, rad)] == [mine.id]
    assert [o.study.id for o in worklist.worklist(db, rad, status="drafted")] == [mine.id]
    assert worklist.worklist(db, rad, status="signed") == []
    with pytest.raises(OrapoError) as refused:
        worklist.worklist(db, rad, everyone=True)
    assert refused.value.code == "forbidden"
    assert {o.study.id for o in worklist.worklist(db, admin, everyone=True)} == {mine.id, theirs.id}
    with pytest.raises(OrapoError):
        drafting.open_study(db, rad, theirs.id)
    assert drafting.open_study(db, admin, theirs.id).study.id == theirs.id


@pytest.mark.slow
def test_readers_drafting_at_once_share_one_running_batch(app_env, tmp_path):
    import threading

    from app.services.reading import drafting
    from db import DraftRepository
    from orapo_core.models.draft import Drafter

    settings, db, admin, rad, other = app_env
    upload = tmp_path / "cache" / "x" / "RG1_J2KR.dcm"
    upload.parent.mkdir(parents=True)
    shutil.copy(pydicom_data_file("RG1_J2KR.dcm"), upload)
    study_id = drafting.ingest_upload(db, settings, rad, upload).study_id

    batches = []

    class CountingDrafter(Drafter):
        def new_decoder(self):  # the batcher's running batch: count the drafts each prefill adds to it
            decoder = super().new_decoder()
            prefill = decoder._prefill

            def counted(cohort):
                batches.append(len(cohort))
                return prefill(cohort)

            decoder._prefill = counted
            return decoder

    registry = drafting.ModelRegistry(
        settings, db, loader=lambda served: CountingDrafter.from_dir(served.model_dir, model_version=served.name)
    )
    served = registry.served()
    assert registry.batcher(served) is registry.batcher(served)
    registry.batcher(served).max_wait_s = 0.2  # room for the threads to arrive together on a busy machine
    records, errors = [], []
    start = threading.Barrier(4)

    def reader():
        start.wait()
        try:
            records.append(drafting.draft_study(db, settings, registry, rad, study_id, samples=2))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and len(records) == 4
    assert sum(batches) == 4 and len(batches) < 4  # fewer prefills than readers: they decoded together
    assert len({r.text for r in records}) == 1  # the same image: the same greedy draft, batched or not
    assert all(r.latency_ms > 0 for r in records)
    assert len({r.id for r in records}) == 4 and all(
        DraftRepository(db).get(r.id).study_id == study_id for r in records
    )


def test_a_draft_the_checks_flag_cannot_be_accepted_unchanged(app_env):
    """Issue 41 §4: a draft with an empty numbered item, or a finding both stated and denied, was signable with
    Accept draft unchanged; the server now refuses it (the page also disables the button), and signing it as
    written after a correction still works."""
    from app.services.reading import reports

    settings, db, admin, rad, other = app_env
    flawed = "FINDINGS: Mild cardiomegaly. Heart size is normal.\nIMPRESSION:\n1.\n2. Cardiomegaly."
    study, draft = _train_study(db, rad, text=flawed)
    for call in (
        lambda: reports.accept_draft(db, rad, study.id, draft.id, draft.text),
        lambda: reports.prepare_report(db, rad, study.id, draft.id, draft.text, sign=True, accept=True),
    ):
        with pytest.raises(OrapoError) as refused:
            call()
        assert refused.value.code == "draft_has_problems" and "Nothing was signed" in refused.value.message
    fixed = "FINDINGS: Mild cardiomegaly.\nIMPRESSION:\n1. Cardiomegaly."
    assert reports.prepare_report(db, rad, study.id, draft.id, fixed, sign=True) is not None
