"""Insight: what the app shows of its own work, as numbers and figures the tabs only place.

The dashboard's numbers for one scope (`dashboard`: studies, reports, pairs,
acceptance over time, what the drafts miss or over-call) and its figures
(`dashboard_charts`), and the Rounds tab's figures of a running round and of
the versions (`round_charts`). The round charts live here rather than in
`rounds`, beside the dashboard's charts that share their `nothing_to_show`:
drawing a figure then loads no round service.
"""
