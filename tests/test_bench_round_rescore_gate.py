"""`bench_round_rescore --gate --set KEY=VALUE`: the round is judged again with those gate settings, on the held-out
set those settings build (e.g. more PhantomCXR negatives), and the JSON says which settings it used."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace


def test_judge_again_builds_the_held_out_set_and_decides_with_the_settings_given(monkeypatch, tmp_path):
    import app.services.rounds as rounds
    import app.services.rounds.heldout as heldout
    import app.services.rounds.worker as worker
    from benchmarks import bench_round_rescore as tool

    seen = {}

    class Heldout:
        def write(self, path):
            return Path(path)

        def summary(self):
            return SimpleNamespace(
                n=320, sources={"holdout_studies": 20, "phantomcxr_negatives": 300}, topped_up_for=[]
            )

    def fake_heldout(database, settings, policy, changes):
        seen["negatives"] = policy.min_finding_negatives
        return Heldout()

    def fake_decide(candidate, served, gate, *, changes):
        seen.setdefault("gates", []).append(gate)
        return SimpleNamespace(verdict="hold", reason="", to_dict=lambda: {})

    evaluation = SimpleNamespace(candidate=SimpleNamespace(predictions=[]), served=SimpleNamespace(predictions=[]))
    monkeypatch.setattr(tool, "changes_of_round", lambda path: {})
    monkeypatch.setattr(heldout, "round_heldout", fake_heldout)
    monkeypatch.setattr(worker, "evaluate_models", lambda spec: evaluation)
    monkeypatch.setattr(rounds, "decide", fake_decide)
    settings = SimpleNamespace(rounds_dir=tmp_path, draft_min_agreement=0.0)
    rows = {"candidate": [], "before": []}
    tool.judge_again(
        settings, None, 1, "base", "adapter", rows, {"min_finding_negatives": 300, "max_finding_fpr": 0.04}
    )
    assert seen["negatives"] == 300
    assert all(g.max_finding_fpr == 0.04 for g in seen["gates"]) and len(seen["gates"]) == 2  # own set and test set
    tool.judge_again(settings, None, 1, "base", "adapter", rows)
    assert seen["negatives"] == 100  # the round's default
