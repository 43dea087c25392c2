"""The dashboard's figures, built in the service layer from literal numbers: no database, no server.

A finding can be missed more often than another yet in a smaller share of the
reports stating it; the "most missed" chart is ranked by the count, so its bars
must be as long as the count written on them, not as the share.
"""

from __future__ import annotations


def _data(**changes):
    from app.services.insight.dashboard import AcceptancePoint, DashboardData, FindingRate

    values = dict(
        scope="everyone",
        studies=6,
        studies_by_status={"new": 1, "drafted": 1, "corrected": 0, "signed": 4, "trained": 0},
        holdout_studies=1,
        drafts=5,
        drafts_by_model={"tiny": 3, "starter": 2},
        corrections=6,
        reports=4,
        signed=4,
        accepted_unchanged=1,
        acceptance_rate=0.25,
        pairs=3,
        pairs_by_source={"correction": 3},
        bucket="day",
        acceptance_over_time=[AcceptancePoint("2026-11-30", 3, 1), AcceptancePoint("2026-12-01", 1, 0)],
        compared_reports=4,
        # Edema: 3 misses of 4 reports (75%); Pneumothorax: 1 of 1 (100%), ranked second by its count
        misses=[FindingRate("Edema", 3, 4), FindingRate("Pneumothorax", 1, 1)],
        overcalls=[FindingRate("Pleural Effusion", 2, 3)],
    )
    values.update(changes)
    return DashboardData(**values)


def test_most_missed_bars_are_as_long_as_the_count_they_are_labelled_with():
    from app.services.insight.dashboard_charts import findings_figure

    missed, overcalled = findings_figure(_data()).data
    # plotly draws the first bar at the bottom: the most missed is last, on top
    assert list(missed.y) == ["Pneumothorax", "Edema"]
    assert list(missed.x) == [1, 3] and list(missed.text) == ["1", "3"]
    assert [row[1] for row in missed.customdata] == ["100%", "75%"]  # the share, in the hover only
    assert list(overcalled.x) == [2] and list(overcalled.text) == ["2"]


def test_the_panels_come_in_the_tabs_order_and_say_when_there_is_nothing_yet():
    from app.services.insight.dashboard_charts import panels

    tiles, status, acceptance, findings, models = panels(_data())
    assert "25%" in tiles and "Showing everyone" in tiles
    assert list(status.data[0].y) == [1, 1, 0, 4, 0]
    assert [t.type for t in acceptance.data] == ["bar", "scatter"]
    assert len(findings.data) == 2 and list(models.data[0].y) == ["tiny", "starter"]

    empty = _data(
        studies=0,
        studies_by_status={},
        drafts=0,
        drafts_by_model={},
        reports=0,
        signed=0,
        accepted_unchanged=0,
        acceptance_rate=None,
        acceptance_over_time=[],
        compared_reports=0,
        misses=[],
        overcalls=[],
        scope="mine",
    )
    tiles, *figures = panels(empty)
    assert "–" in tiles and "your studies" in tiles
    for figure in figures:
        assert figure.layout.annotations and not any(len(t.x or ()) for t in figure.data)
