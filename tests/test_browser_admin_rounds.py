"""The administrator's rounds flow in a real browser: start a round, watch it live, roll back, promote.

Drives Debian's Chromium through Playwright against the launched app, whose
round scheduler is the real one with a policy made for speed: the smoke recipe
(two LoRA steps of a tiny random Qwen2-VL), a held-out set of two studies and
a gate any candidate passes, so the round ends promoted within seconds and the
admin then rolls back to the base model and promotes the round's version again.
Screenshots of each step go to tests/artifacts/.
"""

from __future__ import annotations

import pytest

from tests.support.browser import ARTIFACTS, require_chromium

require_chromium()
pytest.importorskip("trl")

OVERRIDES = "\n".join(
    [
        "max_steps=2",
        "max_completion_length=8",
        "per_device_train_batch_size=4",
        "num_generations=2",
        "use_peft=true",
        "lora_r=4",
        "lora_alpha=8",
        "lora_target_modules=[q_proj, v_proj]",
    ]
)


def seeded(tmp_path, model):
    """Users, a promoted tiny base model, three signed training corrections and two signed held-out studies."""
    from db import ModelVersionRepository, UserRepository
    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import write_dataset
    from tests.support.app import make_env
    from tests.support.rounds import seed_study

    settings, db = make_env(tmp_path, model)
    settings.ensure_dirs()
    write_dataset(tmp_path / "phantom", 5, seed=3, size=64)
    records = load_dataset(tmp_path / "phantom")
    rita = UserRepository(db).get_by_username("rita")
    for r in records[:3]:
        seed_study(db, settings, r, author=rita)
    for r in records[3:5]:
        seed_study(db, settings, r, author=rita, split="holdout")
    base = ModelVersionRepository(db).create("tiny-base", base_model_path=str(model))
    ModelVersionRepository(db).promote(base.id)
    return settings, db, base


def fast_rounds(settings, db):
    from app.services.rounds import RoundPolicy, RoundService
    from app.services.rounds.schedule import RoundScheduler
    from tests.support.rounds import SMOKE

    policy = RoundPolicy(
        recipe=SMOKE,
        min_heldout=1,
        eval_max_new_tokens=8,
        poll_s=0.2,
        cancel_grace_s=3.0,
        f1_tolerance=1.0,
        reward_margin=-1.0,
    )
    return RoundScheduler(db, settings, service=RoundService(db, settings, policy=policy))


def test_admin_starts_watches_rolls_back_and_promotes_a_round(browser, tmp_path, tiny_model):
    from playwright.sync_api import expect

    from db import AuditRepository, ModelVersionRepository, RoundRepository
    from tests.support.app import launched_app

    settings, db, base = seeded(tmp_path, tiny_model)
    ARTIFACTS.mkdir(exist_ok=True)
    with launched_app(settings, db, rounds=fast_rounds(settings, db)) as (url, demo):
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.set_default_timeout(30_000)
        shot = lambda name: page.screenshot(path=str(ARTIFACTS / f"rounds-{name}.png"), full_page=True)  # noqa: E731

        page.goto(url)
        page.get_by_label("username").fill("boss")
        page.get_by_label("password").fill("admin-pass-1")
        page.get_by_role("button", name="Login").click()
        expect(page.locator("#orapo-whoami")).to_contain_text("Signed in as boss (admin)")
        page.get_by_role("tab", name="Rounds").click()
        expect(page.locator("#orapo-versions-table")).to_contain_text("tiny-base")
        expect(page.locator("#orapo-schedule-status")).to_contain_text("3 signed corrections wait")
        expect(page.locator("#orapo-plot-f1")).to_contain_text("No evaluated versions yet")
        shot("1-overview")

        page.locator("#orapo-round-overrides textarea").fill(OVERRIDES)
        page.locator("#orapo-start-round").click()
        status = page.locator("#orapo-round-status")
        expect(page.locator("#orapo-rounds-result")).to_contain_text("Round 1 started")
        expect(status).to_contain_text("running")
        shot("2-running")

        expect(status).to_contain_text("promoted", timeout=120_000)  # the timer polled it to the end
        expect(status).to_contain_text("Gate: promote")
        expect(page.locator("#orapo-cancel-round")).to_be_disabled()  # nothing left to cancel
        for plot in ("reward", "zero", "weight", "losses"):
            expect(page.locator(f"#orapo-plot-{plot} .js-plotly-plot")).to_be_visible()
        expect(page.locator("#orapo-plot-losses")).to_contain_text("GRPO loss")
        expect(page.locator("#orapo-plot-f1 .js-plotly-plot")).to_be_visible()
        expect(page.locator("#orapo-versions-table")).to_contain_text("round-1")
        page.get_by_text("Round log").click()
        expect(page.locator("#orapo-round-log")).to_contain_text("gate: promote")
        shot("3-finished")

        round_version = ModelVersionRepository(db).promoted()
        assert round_version.round_id == 1 and round_version.parent_id == base.id
        page.locator("#orapo-rollback").click()  # the version field is empty: back to the served version's parent
        expect(page.locator("#orapo-version-question")).to_contain_text(f"Roll back to version {base.id} (tiny-base)?")
        page.locator("#orapo-confirm-rollback").click()  # it asked first
        expect(page.locator("#orapo-rounds-result")).to_contain_text(f"Rolled back: version {base.id} (tiny-base)")
        assert ModelVersionRepository(db).promoted().id == base.id
        shot("4-rolled-back")

        page.locator("#orapo-versions-table [data-testid=cell-0-0]").click()  # newest first: the round's version
        expect(page.locator("#orapo-version-id input")).to_have_value(str(round_version.id))
        page.get_by_label("Reason (kept in the audit log)").fill("reviewed the held-out drafts")
        page.locator("#orapo-promote").click()
        page.locator("#orapo-confirm-promote").click()
        expect(page.locator("#orapo-rounds-result")).to_contain_text(f"Version {round_version.id} (round-1) now drafts")
        shot("5-promoted-again")

    assert ModelVersionRepository(db).promoted().id == round_version.id
    assert RoundRepository(db).get(1).status == "promoted"
    promotions = AuditRepository(db).query(action="version.promote")
    assert promotions[0].actor_name == "boss" and promotions[0].details["reason"] == "reviewed the held-out drafts"
