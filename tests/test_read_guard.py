"""The server's half of "a report never lands on another study" and "no switch loses an edit", without a browser.

A save or sign whose study is not the one the page's session has open is refused, and nothing is stored; an
unsaved edit is kept per reader and study, never shown to another reader, and gone once the report is stored.
"""

from __future__ import annotations

from dataclasses import replace

import gradio as gr
import pytest

from tests.support.app import make_env, phantom_png


@pytest.fixture()
def env(tmp_path):
    settings, db = make_env(tmp_path)
    return settings, db, tmp_path


def _study(db, settings, root, seed: int, username: str = "rita") -> int:
    from app.services.reading import drafting
    from db import UserRepository

    user = UserRepository(db).get_by_username(username)
    (outcome,) = drafting.ingest_uploads(db, settings, user, [str(phantom_png(root / f"s{seed}.png", seed=seed))])
    assert outcome.ok, outcome.message
    return outcome.study_id


def _fn(demo, api_name: str):
    return next(fn for fn in demo.fns.values() if fn.api_name == api_name)


def test_a_sign_for_a_study_the_page_no_longer_shows_is_refused(env):
    from app.gradio_internals import context_of
    from app.server import build_app
    from app.tabs.session import PageSession
    from db import CorrectionRepository

    settings, db, root = env
    study_a, study_b = _study(db, settings, root, 51), _study(db, settings, root, 52)
    demo = build_app(settings=settings, database=db)
    ctx = context_of(demo)
    page = type("Request", (), {"username": "rita", "headers": {"x-gradio-user": "api"}, "session_hash": "page-1"})()
    state_a = PageSession(owner="rita", study_id=study_a, image_id=1)
    ctx.sessions.note_open("page-1", study_b)  # the page went on to study B while its state still said A
    for api_name in ("sign_report", "save_correction"):
        with pytest.raises(gr.Error, match=f"now shows study {study_b}, not study {study_a}"):
            _fn(demo, api_name).fn("Small right pleural effusion.", state_a, request=page)
    assert CorrectionRepository(db).history(study_a) == []

    # the same page with study A open stores it (the refusal above is the study's, not the handler's)
    ctx.sessions.note_open("page-1", study_a)
    save = _fn(demo, "save_correction")
    stored = save.fn("Small right pleural effusion.", state_a, request=page)
    # the answer names its outputs: the status line says what was stored, and the page's session stands on it
    assert {id(component) for component in stored} <= {id(component) for component in save.outputs}
    status = next(c for c in save.outputs if getattr(c, "elem_id", None) == "orapo-status")
    assert "Report version 1" in stored[status]
    session = save.inputs[1]  # the event reads the page's session and answers the new one
    assert stored[session] == replace(state_a, report_version=1, saved_text="Small right pleural effusion.")
    assert [c.text for c in CorrectionRepository(db).history(study_a)] == ["Small right pleural effusion."]


def test_an_unsaved_edit_is_kept_per_reader_and_study_and_ends_when_stored(env):
    from app.services.reading import autosave
    from db import AutosaveRepository, UserRepository

    settings, db, root = env
    study = _study(db, settings, root, 53)
    users = UserRepository(db)
    rita, omar = users.get_by_username("rita"), users.get_by_username("omar")
    assert autosave.keep(db, rita, study, "   ", base_version=0) is None  # nothing to keep
    autosave.keep(db, rita, study, "Small left effusion.", base_version=0)
    autosave.keep(db, rita, study, "Moderate left effusion.", base_version=0)  # written over, one row
    assert autosave.unsaved(db, rita, study, stored=None).text == "Moderate left effusion."
    assert autosave.unsaved(db, omar, study, stored=None) is None  # never another reader's
    # the stored report is the same text: nothing unsaved is left, and the row goes
    assert autosave.unsaved(db, rita, study, stored="Moderate left  effusion.") is None
    assert AutosaveRepository(db).get(rita.id, study) is None
    autosave.keep(db, rita, study, "Large left effusion.", base_version=1)
    # text edited from version 1 outlives a page back at version 2's report (it is quoted there to copy from)
    assert autosave.discard(db, rita, study, base_version=2) is False
    assert autosave.discard(db, rita, study) is True and autosave.discard(db, rita, study) is False


def test_a_page_reopening_a_study_gets_its_unsaved_edit_back(env):
    from app.gradio_internals import context_of
    from app.server import build_app
    from app.services.reading import autosave
    from app.tabs.session import PageSession
    from db import CorrectionRepository, UserRepository

    settings, db, root = env
    study = _study(db, settings, root, 54)
    demo = build_app(settings=settings, database=db)
    ctx = context_of(demo)
    rita = UserRepository(db).get_by_username("rita")
    CorrectionRepository(db).create(study, author_id=rita.id, text="No effusion.")
    autosave.keep(db, rita, study, "Small right effusion.", base_version=1)
    page = type("Request", (), {"username": "rita", "headers": {}, "session_hash": "page-2"})()
    open_study = _fn(demo, "open_study")  # the worklist's "Open in Read tab": the study, the order, text, session
    report, status = (
        next(c for c in open_study.outputs if getattr(c, "elem_id", None) == name)
        for name in ("orapo-report", "orapo-status")
    )
    session = open_study.inputs[3]

    opened = open_study.fn(str(study), None, "", PageSession(), request=page)
    assert opened[report].value == "Small right effusion."  # the edit, in the report box
    assert opened[session] == PageSession(
        owner="rita", study_id=study, image_id=opened[session].image_id, report_version=1, saved_text="No effusion."
    )  # still unsaved: leaving asks
    assert ctx.sessions.open_study("page-2") == study

    # made before someone stored version 2: quoted to copy from, never put in the box as if it were current
    CorrectionRepository(db).amend(
        CorrectionRepository(db).latest_for_study(study).id, author_id=rita.id, text="Small left effusion."
    )
    opened = open_study.fn(str(study), None, "", opened[session], request=page)
    assert opened[report].value == "Small left effusion." and opened[session].report_version == 2
    assert "> Small right effusion." in opened[status]
