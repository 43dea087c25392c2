"""The dashboard: numbers a person can check by hand on a seeded database, whose numbers each user sees, and the charts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orapo_core.errors import OrapoError


def _uids(split: str, prefix: str = "dash-uid"):
    from db.repositories.studies import split_for

    return (f"{prefix}-{i}" for i in range(10_000) if split_for(f"{prefix}-{i}") == split)


def seed(db) -> tuple:
    """rita: 3 studies (one draft corrected for a missed effusion, one accepted unchanged, one only drafted);
    omar: one over-called effusion and missed edema (saved, then amended), and one held-out study with nothing yet."""
    from app.services.reading import reports
    from db import DraftRepository, StudyRepository, UserRepository

    users = UserRepository(db)
    boss, rita, omar = (users.get_by_username(n) for n in ("boss", "rita", "omar"))
    studies, drafts = StudyRepository(db), DraftRepository(db)
    train = _uids("train")

    def drafted(user, text, **kw):
        study = studies.create(next(train), f"ANON-{user.username}", uploaded_by=user.id)
        return study, drafts.create(
            study.id, model_name="tiny", prompt="Describe.", text=text, created_by=user.id, **kw
        )

    missed, d1 = drafted(rita, "The lungs are clear. No pneumothorax.")
    reports.save_report(db, rita, missed.id, d1.id, "Small left pleural effusion. No pneumothorax.", sign=True)
    accepted, d2 = drafted(rita, "Heart size is normal. No pleural effusion.")
    reports.accept_draft(db, rita, accepted.id, d2.id, d2.text)
    drafted(rita, "No acute cardiopulmonary process.", sampling={"model_version": "starter"})

    overcalled, d4 = drafted(omar, "Moderate cardiomegaly. Small right pleural effusion.")
    reports.save_report(db, omar, overcalled.id, d4.id, "Moderate cardiomegaly.", sign=False)
    reports.save_report(db, omar, overcalled.id, d4.id, "Moderate cardiomegaly. Mild pulmonary edema.", sign=True)
    studies.create(next(_uids("holdout")), "ANON-omar-2", uploaded_by=omar.id)
    return boss, rita, omar


@pytest.fixture
def seeded(tmp_path):
    from tests.support.app import make_env

    settings, db = make_env(tmp_path)  # boss (admin), rita and omar (radiologists)
    return (db, *seed(db))


def test_a_radiologist_sees_her_own_numbers(seeded):
    from app.services.insight.dashboard import FindingRate, dashboard_data

    db, boss, rita, omar = seeded
    data = dashboard_data(db, rita)
    assert data.scope == "mine"
    assert (data.studies, data.drafts, data.corrections, data.reports, data.signed) == (3, 3, 2, 2, 2)
    assert data.studies_by_status == {"new": 0, "drafted": 1, "corrected": 0, "signed": 2, "trained": 0}
    assert (data.accepted_unchanged, data.acceptance_rate) == (1, 0.5)  # 2 reports, 1 accepted unchanged
    assert data.pairs == 1 and data.pairs_by_source["clinician_edit"] == 1 and data.holdout_studies == 0
    assert data.drafts_by_model == {"tiny": 2, "starter": 1}
    assert data.compared_reports == 2
    assert data.misses == [FindingRate("Pleural Effusion", 1, 1)]  # the draft without "effusion"
    assert data.overcalls == []
    assert [(p.reports, p.accepted_unchanged) for p in data.acceptance_over_time] == [(2, 1)]
    assert data.bucket == "day" and data.acceptance_over_time[0].period == datetime.now(UTC).date().isoformat()


def test_an_administrator_sees_everyone_and_agrees_with_the_repository_counts(seeded):
    from app.services.insight.dashboard import FindingRate, dashboard_data
    from db import DashboardRepository

    db, boss, rita, omar = seeded
    data = dashboard_data(db, boss)
    assert data.scope == "everyone"
    assert (data.studies, data.holdout_studies, data.drafts, data.corrections, data.reports) == (5, 1, 4, 4, 3)
    assert data.acceptance_rate == pytest.approx(1 / 3)
    assert data.pairs == 3  # rita's edit, omar's first version and his amendment
    assert data.misses == [FindingRate("Edema", 1, 1), FindingRate("Pleural Effusion", 1, 1)]
    assert data.overcalls == [FindingRate("Pleural Effusion", 1, 1)]  # omar's draft: effusion the report dropped
    counts = DashboardRepository(db).counts()
    assert (counts.studies, counts.studies_by_status, counts.holdout_studies, counts.corrections) == (
        data.studies,
        data.studies_by_status,
        data.holdout_studies,
        data.corrections,
    )
    assert (counts.signed_corrections, counts.pairs, counts.accepted_unchanged_rate) == (
        data.signed,
        data.pairs,
        data.acceptance_rate,
    )
    assert {k: v for k, v in counts.pairs_by_source.items() if v} == {
        k: v for k, v in data.pairs_by_source.items() if v
    }

    mine = dashboard_data(db, boss, scope="mine")
    assert (mine.scope, mine.studies, mine.acceptance_rate, mine.misses) == ("mine", 0, None, [])


def test_everyone_is_refused_to_a_radiologist(seeded):
    from app.services.insight.dashboard import dashboard_data

    db, boss, rita, omar = seeded
    with pytest.raises(OrapoError) as refused:
        dashboard_data(db, rita, scope="everyone")
    assert refused.value.code == "forbidden"
    with pytest.raises(OrapoError) as bad:
        dashboard_data(db, rita, scope="theirs")
    assert bad.value.code == "invalid_scope"
    assert dashboard_data(db, omar).studies == 2  # his own, not rita's


def test_only_signed_reports_count_as_misses(seeded):
    from app.services.insight.dashboard import dashboard_data
    from app.services.reading import reports
    from db import DraftRepository, StudyRepository

    db, boss, rita, omar = seeded
    study = StudyRepository(db).create(next(_uids("train", "late")), "ANON-x", uploaded_by=rita.id)
    draft = DraftRepository(db).create(study.id, model_name="tiny", prompt="Describe.", text="The lungs are clear.")
    reports.save_report(db, rita, study.id, draft.id, "Right pneumothorax.", sign=False)
    data = dashboard_data(db, rita)
    assert (data.reports, data.signed, data.compared_reports) == (3, 2, 2)
    assert "Pneumothorax" not in {r.finding for r in data.misses}
    reports.save_report(db, rita, study.id, draft.id, "Right pneumothorax.", sign=True)
    assert "Pneumothorax" in {r.finding for r in dashboard_data(db, rita).misses}


def test_acceptance_is_grouped_by_day_or_iso_week(seeded):
    from sqlalchemy import update

    from app.services.insight.dashboard import dashboard_data
    from db.models import Correction

    db, boss, rita, omar = seeded
    when = {
        1: datetime(2026, 11, 2, 9),
        2: datetime(2026, 11, 3, 9),
        3: datetime(2026, 11, 3, 10),
        4: datetime(2026, 11, 10, 9),
    }
    with db.session() as session:
        for correction_id, at in when.items():
            session.execute(update(Correction).where(Correction.id == correction_id).values(created_at=at))
    daily = dashboard_data(db, boss, bucket="day")
    # latest versions: rita's edit (Nov 2), rita's accept (Nov 3), omar's amendment (Nov 10)
    assert [(p.period, p.reports, p.accepted_unchanged) for p in daily.acceptance_over_time] == [
        ("2026-11-02", 1, 0),
        ("2026-11-03", 1, 1),
        ("2026-11-10", 1, 0),
    ]
    weekly = dashboard_data(db, boss, bucket="week")
    assert [(p.period, p.reports, p.rate) for p in weekly.acceptance_over_time] == [
        ("2026-W45", 2, 0.5),
        ("2026-W46", 1, 0.0),
    ]
    assert dashboard_data(db, boss).bucket == "day"  # a short span stays daily
    with db.session() as session:
        session.execute(update(Correction).where(Correction.id == 4).values(created_at=datetime(2027, 3, 1)))
    assert dashboard_data(db, boss).bucket == "week"
    with pytest.raises(OrapoError):
        dashboard_data(db, boss, bucket="month")


@pytest.mark.slow
def test_the_charts_draw_the_numbers_and_an_empty_dashboard(seeded):
    from app.services.insight import dashboard_charts as charts
    from app.services.insight.dashboard import dashboard_data

    db, boss, rita, omar = seeded
    data = dashboard_data(db, boss)
    status = charts.status_figure(data)
    assert list(status.data[0].x) == ["new", "drafted", "corrected", "signed", "trained"]
    assert list(status.data[0].y) == [1, 1, 0, 3, 0]
    acceptance = charts.acceptance_figure(data)
    assert [t.type for t in acceptance.data] == ["bar", "scatter"] and list(acceptance.data[1].y) == pytest.approx(
        [100 / 3]
    )
    assert acceptance.data[1].yaxis == "y2" and list(acceptance.data[0].y) == [3]
    findings = charts.findings_figure(data)
    missed, overcalled = findings.data
    assert (missed.orientation, set(missed.y), list(overcalled.y)) == (
        "h",
        {"Edema", "Pleural Effusion"},
        ["Pleural Effusion"],
    )
    # one measure per chart: each bar is as long as the count it is labelled with (the share is in the hover)
    assert list(overcalled.text) == ["1"] and list(overcalled.x) == [1] and list(overcalled.customdata) == [[1, "100%"]]
    assert [str(x) for x in missed.x] == list(missed.text)
    assert list(charts.models_figure(data).data[0].y) == ["tiny", "starter"]
    html = charts.tiles_html(data)
    assert "33%" in html and "everyone" in html and ">5<" in html

    empty = dashboard_data(db, boss, scope="mine")
    for make in (charts.status_figure, charts.acceptance_figure, charts.findings_figure, charts.models_figure):
        fig = make(empty)
        assert fig.layout.annotations and fig.to_json()  # says "no ... yet", and serialises
    assert "–" in charts.tiles_html(empty)


@pytest.mark.slow
def test_the_launched_app_enforces_whose_numbers(tmp_path):
    from gradio_client.exceptions import AppError

    from tests.support.app import client, launched_app, make_env

    settings, db = make_env(tmp_path)
    seed(db)
    with launched_app(settings, db) as (url, demo):
        rita = client(url, "rita", "rita-pass-1")
        with pytest.raises(AppError, match="Only an administrator"):
            rita.predict("everyone", "auto", api_name="/dashboard")
        scope, tiles, *plots = rita.predict("mine", "auto", api_name="/dashboard")
        assert scope == "mine" and "your studies" in tiles and ">3<" in tiles and len(plots) == 4
        scope, tiles, *plots = client(url, "boss", "admin-pass-1").predict(None, "auto", api_name="/dashboard")
        assert scope == "everyone" and "everyone" in tiles and ">5<" in tiles and all(p for p in plots)


@pytest.mark.slow
def test_the_dashboard_draws_its_charts_in_a_browser(tmp_path, browser):
    from playwright.sync_api import expect

    from tests.support.app import launched_app, make_env
    from tests.support.browser import ARTIFACTS

    settings, db = make_env(tmp_path)
    seed(db)
    ARTIFACTS.mkdir(exist_ok=True)
    with launched_app(settings, db) as (url, _):
        for who, password, scope, studies in (
            ("boss", "admin-pass-1", "everyone", "5"),
            ("rita", "rita-pass-1", "your", "3"),
        ):
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(30_000)
            page.goto(url)
            page.get_by_label("username").fill(who)
            page.get_by_label("password").fill(password)
            page.get_by_role("button", name="Login").click()
            page.get_by_role("tab", name="Dashboard").click()  # opening the tab loads the numbers
            tiles = page.locator("#orapo-dashboard-tiles")
            expect(tiles).to_contain_text(f"Studies{studies}", timeout=30_000)
            expect(page.get_by_text(f"Showing {scope}")).to_be_visible(timeout=30_000)
            expect(page.locator(".js-plotly-plot")).to_have_count(4, timeout=30_000)
            expect(page.locator(".js-plotly-plot").nth(2)).to_contain_text("Pleural Effusion", timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / f"dashboard-{who}.png"), full_page=True)
            page.close()
