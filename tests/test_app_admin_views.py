"""Issue 41 §5 and §8, the administrator's side, below the browser: the handlers of the built app called as the page
calls them.

The versions table shows the folder serving at first start and every version's model card; promote, roll back,
disable and reset password ask first, naming what they act on, and act only from the question's own button; a
round that ends refreshes the corrections-waiting line; the worklist's "everyone" view names each study's owner and
the tab shows the selected study's history afresh when opened; the dashboard counts each model once.
"""

from __future__ import annotations

import gradio as gr
import pytest

from tests.support.app import make_env


@pytest.fixture()
def env(tmp_path):
    from orapo_core.models.loading import resolve_model_dir

    settings, db = make_env(tmp_path)
    resolve_model_dir(settings=settings)  # the shipped starter copied in, as `orapo serve` does at its start
    return settings, db


@pytest.fixture()
def app(env):
    from app.server import build_app

    settings, db = env
    return build_app(settings=settings, database=db), db


def page(user: str = "boss"):
    """A request as a script sends it (so a refusal is raised, not only shown in the page)."""
    return type("Request", (), {"username": user, "headers": {"x-gradio-user": "api"}, "session_hash": "page-1"})()


def element(demo, elem_id: str):
    return next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def on(demo, elem_id: str, event: str = "click"):
    """The event a component of the page triggers (its handler is `.fn`, its outputs `.outputs`)."""
    block = element(demo, elem_id)
    return next(dep for dep in demo.fns.values() if (block._id, event) in [tuple(t) for t in dep.targets])


def named(demo, api_name: str):
    return next(dep for dep in demo.fns.values() if dep.api_name == api_name)


def by_id(answer: dict) -> dict:
    """An answer keyed by component, re-keyed by elem_id (components without one left out)."""
    return {c.elem_id: v for c, v in answer.items() if getattr(c, "elem_id", None)}


def visible(update) -> bool:
    return update.get("visible") if isinstance(update, dict) else update.visible


def _versions(db):
    from db import ModelVersionRepository

    versions = ModelVersionRepository(db)
    base = versions.create("base-starter", base_model_path="models/starter", config={"registered_by_round": 1})
    versions.promote(base.id, reason="the model served before the first promoted round")
    candidate = versions.create("round-1", base_model_path="models/starter", parent_id=base.id, round_id=None)
    rejected = versions.create("round-2", base_model_path="models/starter", parent_id=base.id)
    versions.reject(rejected.id, reason="reject: below the served model")
    return versions, base, candidate, rejected


# --- §5: the serving model from the first start, and every version's card -----------------------------------------


def test_the_versions_table_shows_the_serving_starter_at_first_start_and_each_card(app):
    demo, db = app
    from db import ModelVersionRepository

    overview = by_id(named(demo, "rounds_overview").fn(None, request=page()))
    (row,) = overview["orapo-versions-table"]
    assert row[:3] == ["—", "starter", "serving"]
    assert "not yet a version" in row[7] and "base-starter" in row[7]

    card = named(demo, "model_card").fn("", request=page())  # an empty field: the model drafting now
    assert "Model card: starter" in card and "synthetic PhantomCXR" in card and "Intended use" in card
    picked = gr.SelectData(None, {"index": [0, 1], "value": "starter", "row_value": row})
    answer = by_id(on(demo, "orapo-versions-table", "select").fn(picked, request=page()))
    assert answer["orapo-version-id"] == "" and "Model card: starter" in answer["orapo-model-card"]

    base = ModelVersionRepository(db).create("base-starter", base_model_path="models/starter")
    ModelVersionRepository(db).promote(base.id)
    rows = by_id(named(demo, "rounds_overview").fn(None, request=page()))["orapo-versions-table"]
    assert [r[0] for r in rows] == [base.id]  # a promoted version serves: no row beside it
    picked = gr.SelectData(None, {"index": [0, 0], "value": base.id, "row_value": rows[0]})
    answer = by_id(on(demo, "orapo-versions-table", "select").fn(picked, request=page()))
    assert answer["orapo-version-id"] == str(base.id)
    assert f"Model card: base-starter (version {base.id})" in answer["orapo-model-card"]
    with pytest.raises(gr.Error, match="Only an administrator"):
        named(demo, "model_card").fn("", request=page("rita"))


def test_a_reason_added_by_hand_is_shown_whole_after_the_gates(app):
    from app.tabs.rounds_versions import version_rows

    demo, db = app
    versions, base, candidate, rejected = _versions(db)
    gate = "promote: " + "macro-F1 above the served model's on 40 held-out studies, the interval clear of zero; " * 3
    versions.promote(candidate.id, reason=gate)  # as the gate promotes it
    versions.promote(base.id, reason="rolled back for a look")
    versions.promote(candidate.id, reason="reviewed the drafts by hand")  # and an administrator, again
    row = next(r for r in version_rows(versions.list()) if r[0] == candidate.id)
    assert row[7] == f"{gate} — then: reviewed the drafts by hand"  # whole, not clipped: the table wraps it
    assert element(demo, "orapo-versions-table").wrap


# --- §8: confirmations --------------------------------------------------------------------------------------------


def test_promote_and_roll_back_ask_first_naming_both_versions(app):
    demo, db = app
    versions, base, candidate, rejected = _versions(db)

    promote_button, rollback_button = on(demo, "orapo-promote"), on(demo, "orapo-rollback")
    assert promote_button.api_name != "promote_version" and rollback_button.api_name != "rollback_version"
    asked = by_id(promote_button.fn(str(candidate.id), "better on held-out", request=page()))
    assert "Promote version 2 (round-1)?" in asked["orapo-version-question"]
    assert "in place of version 1 (base-starter)" in asked["orapo-version-question"]
    assert "better on held-out" in asked["orapo-version-question"]
    assert visible(asked["orapo-version-confirm"]) and not visible(asked["orapo-confirm-rollback"])
    assert versions.promoted().id == base.id  # asking changed nothing
    with pytest.raises(gr.Error, match="rejected"):
        promote_button.fn(str(rejected.id), "", request=page())
    with pytest.raises(gr.Error, match="already the served model"):
        promote_button.fn(str(base.id), "", request=page())
    with pytest.raises(gr.Error, match="Only an administrator"):
        promote_button.fn(str(candidate.id), "", request=page("rita"))

    # the question's own button acts, on the version the question named (a hidden field, not the one typed)
    confirm = on(demo, "orapo-confirm-promote")
    assert confirm.api_name == "promote_version"
    assert [getattr(c, "label", None) for c in confirm.inputs] == ["Version", "Reason"]
    done = by_id(confirm.fn(str(candidate.id), "better on held-out", request=page()))
    assert versions.promoted().id == candidate.id and "now drafts" in done["orapo-rounds-result"]
    assert not visible(done["orapo-version-confirm"])

    asked = by_id(rollback_button.fn("", "", request=page()))  # empty: the served version's parent
    assert "Roll back to version 1 (base-starter)?" in asked["orapo-version-question"]
    assert "in place of version 2 (round-1)" in asked["orapo-version-question"]
    assert visible(asked["orapo-confirm-rollback"]) and not visible(asked["orapo-confirm-promote"])
    assert versions.promoted().id == candidate.id
    with pytest.raises(gr.Error, match="rejected"):
        rollback_button.fn(str(rejected.id), "", request=page())
    confirm = on(demo, "orapo-confirm-rollback")
    assert confirm.api_name == "rollback_version"
    confirm.fn(str(base.id), "", request=page())
    assert versions.promoted().id == base.id


def test_disable_and_reset_password_ask_first_naming_the_account(app):
    from db import UserRepository

    demo, db = app
    users = UserRepository(db)
    disable, reset = on(demo, "orapo-user-disable"), on(demo, "orapo-user-reset")
    assert disable.api_name != "disable_user" and reset.api_name != "reset_password"

    asked = by_id(disable.fn(" Rita ", request=page()))
    assert "Disable rita** (radiologist)?" in asked["orapo-user-question"]
    assert visible(asked["orapo-user-confirm"]) and not visible(asked["orapo-confirm-reset"])
    assert users.get_by_username("rita").active  # asking changed nothing
    with pytest.raises(gr.Error, match="cannot disable your own account"):
        disable.fn("boss", request=page())
    with pytest.raises(gr.Error, match="no user named 'nobody'"):
        disable.fn("nobody", request=page())

    confirm = on(demo, "orapo-confirm-disable")
    assert confirm.api_name == "disable_user" and confirm.inputs[0].label == "Username"
    done = confirm.fn("rita", request=page())
    assert not users.get_by_username("rita").active
    table = next(v for c, v in done.items() if getattr(c, "elem_id", None) == "orapo-users")
    assert ["rita", "radiologist", False] == next(r for r in table if r[0] == "rita")[:3]  # the table, fresh

    asked = by_id(reset.fn("omar", request=page()))
    assert "Reset the password of omar** (radiologist)?" in asked["orapo-user-question"]
    assert visible(asked["orapo-confirm-reset"]) and not users.get_by_username("omar").must_change_password
    confirm = on(demo, "orapo-confirm-reset")
    assert confirm.api_name == "reset_password"
    done = by_id(confirm.fn("omar", request=page()))
    assert users.get_by_username("omar").must_change_password and "shown once" in done["orapo-users-result"]
    assert not visible(done["orapo-user-confirm"])


# --- §8: live refresh -------------------------------------------------------------------------------------------


def test_a_round_that_ends_refreshes_the_corrections_waiting_line(app, env, tmp_path):
    from db import CorrectionRepository, RoundRepository, UserRepository
    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import write_dataset
    from tests.support.rounds import seed_study

    demo, db = app
    settings, _ = env
    write_dataset(tmp_path / "phantom", 2, seed=3, size=64)
    rita = UserRepository(db).get_by_username("rita")
    corrections = [seed_study(db, settings, r, author=rita)[1] for r in load_dataset(tmp_path / "phantom")]
    status = named(demo, "round_status")
    rounds = RoundRepository(db)
    running = rounds.create(trigger="manual", config={})
    rounds.transition(running.id, "running")
    assert "orapo-schedule-status" not in by_id(status.fn(running.id, request=page()))  # nothing ended yet

    CorrectionRepository(db).mark_trained([c.id for c in corrections], running.id)
    rounds.transition(running.id, "succeeded")
    ended = by_id(status.fn(running.id, request=page()))
    assert "(0 signed corrections wait for a round)" in ended["orapo-schedule-status"]
    assert any(c is element(demo, "orapo-schedule-status") for c in status.outputs)


def test_the_worklist_names_owners_for_everyone_and_refreshes_history_when_opened(app):
    from app.tabs import worklist
    from db import CorrectionRepository, DraftRepository, ModelVersionRepository, StudyRepository, UserRepository

    demo, db = app
    rita = UserRepository(db).get_by_username("rita")
    study = StudyRepository(db).create("owner-uid-1", "ANON-owner", uploaded_by=rita.id)
    version = ModelVersionRepository(db).create("round-1", base_model_path="models/starter")
    draft = DraftRepository(db).create(
        study.id,
        model_name="starter",
        prompt="p",
        text="No effusion.",
        model_version_id=version.id,
        sampling={"model_version": "round-1"},
    )

    listing = named(demo, "worklist")
    everyone = listing.fn("all", "everyone", "oldest first", request=page())
    assert everyone["headers"][:2] == ["Study", "Owner"] and everyone["data"][0][:2] == [study.id, "rita"]
    assert everyone["data"][0][7] == f"{draft.id} by round-1 (version {version.id})"  # not "(starter)"
    mine = listing.fn("all", "mine", "oldest first", request=page("rita"))
    assert mine["headers"] == worklist.COLUMNS and mine["data"][0][0] == study.id
    with pytest.raises(gr.Error, match="Only an administrator"):
        listing.fn("all", "everyone", "oldest first", request=page("rita"))
    assert len(worklist.WIDTHS) == len(worklist.COLUMNS) and len(worklist.EVERYONE_WIDTHS) == len(worklist.COLUMNS) + 1

    opened = next(
        dep
        for dep in demo.fns.values()
        if getattr(dep.fn, "__qualname__", "").startswith("build.<locals>.opened")
        and dep.fn.__module__ == "app.tabs.worklist"
    )
    before = by_id(opened.fn("all", "mine", "oldest first", str(study.id), request=page("rita")))
    assert [row[0] for row in before["orapo-worklist-history"]] == [f"draft {draft.id}"]
    CorrectionRepository(db).create(study.id, author_id=rita.id, text="Small effusion.", draft_id=draft.id, signed=True)
    after = by_id(opened.fn("all", "mine", "oldest first", str(study.id), request=page("rita")))
    assert [row[0] for row in after["orapo-worklist-history"]] == [f"draft {draft.id}", "report v1"]
    assert after["orapo-worklist"].column_widths == worklist.WIDTHS


# --- §8: the dashboard counts each model once ---------------------------------------------------------------------


def test_the_dashboard_counts_the_starter_and_its_base_version_as_one_model(env):
    from app.services.insight.dashboard import dashboard_data
    from db import DraftRepository, ModelVersionRepository, StudyRepository, UserRepository

    settings, db = env
    rita = UserRepository(db).get_by_username("rita")
    studies, drafts, versions = StudyRepository(db), DraftRepository(db), ModelVersionRepository(db)

    def drafted(uid: str, **draft) -> None:
        study = studies.create(uid, f"ANON-{uid}", uploaded_by=rita.id)
        drafts.create(study.id, prompt="p", text="No effusion.", **draft)

    drafted("dash-1", model_name="starter", sampling={"model_version": "starter"})  # first start: the folder
    # the first round records the folder it served as base-starter and promotes it (its candidate was rejected)
    base = versions.create("base-starter", base_model_path="models/starter", config={"registered_by_round": 1})
    versions.promote(base.id)
    drafted("dash-2", model_name="starter", model_version_id=base.id, sampling={"model_version": "base-starter"})
    one = versions.create(
        "round-2", base_model_path="models/starter", adapter_path="models/versions/round-2", parent_id=base.id
    )
    versions.promote(one.id)
    # a draft stored before drafts carried their version's name: the base folder's name only
    drafted("dash-3", model_name="starter", model_version_id=one.id, sampling={})
    drafted("dash-4", model_name="starter", model_version_id=one.id, sampling={"model_version": "round-2"})

    data = dashboard_data(db, UserRepository(db).get_by_username("boss"))
    assert data.drafts_by_model == {f"round-2 (version {one.id})": 2, f"base-starter (version {base.id})": 2}
    assert data.drafts == 4
