"""A clinic story's round scored again: its candidate and the model it started from, on the same test studies.

Reads the data folder a clinic story left (`benchmarks.bench_round_story --data-dir DIR --seed S`) and, with no
new round, scores round `--round`'s candidate and its starting model again on the story's test studies (the
same `--seed` draws the same ones), with the same measures and the false positives broken down by the
negatives' other findings. Optionally first fits the finding verifier of that round's version again, as a round
with finding_verifier on does, and probes how well each model's states tell the films with the finding from
those without.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_round_rescore --data-dir DIR --seed S [--fit-verifier] [--gate] [--state-probes] --json OUT
    orapo bench round_rescore --data-dir DIR --seed S

`--gate` also judges the round again with this checkout's gate (`app.services.rounds.decide`, its default
policy): once on the round's own held-out set as a round would build it now (the clinic's held-out studies,
topped up with PhantomCXR negatives of the corrected findings), drafted by both models as the round's Evaluate
step drafts, and once on the test studies scored here (125 with the finding, 200 without), and says whether the
two verdicts agree: how far the gate's decision on its small set is the one a 325-study test set would make.

The same models with their finding checks set aside: `benchmarks.bench_round_drafts_alone`.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image

from benchmarks.bench_finding_evidence import merged_tokens
from benchmarks.bench_probe import ridge_probe_auc
from benchmarks.round_story_common import (
    command,
    finish_tool,
    fit_version_verifier,
    make_tool_parser,
    open_round,
    outcome,
    phantom_test_records,
    test_dir,
    test_studies,
)
from orapo_core.data.records import CHEXPERT_14, parse_label
from orapo_core.facts import label_report
from orapo_core.models.verifier import prompt_states


def make_parser() -> argparse.ArgumentParser:
    parser = make_tool_parser(
        __doc__, "the round whose candidate and starting model are scored again (default 1, the story's one round)"
    )
    parser.add_argument(
        "--fit-verifier",
        action="store_true",
        help="first fit the finding verifier of that round's version as a round with "
        "finding_verifier on does (orapo_core.models.verifier.fit_round_verifier, on the round's "
        "own train.csv; --set finding_verifier_add_max_fpr=0 fits it without its additions), "
        "save it beside the version's adapter, then score",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --fit-verifier: the round setting finding_verifier_add_max_fpr to fit with; with --gate: round "
        "settings of the gate and its held-out set (e.g. min_finding_negatives=300) to judge with",
    )
    parser.add_argument(
        "--state-probes",
        action="store_true",
        help="also how well a linear probe tells the test films with the finding from those without, "
        "from each model's merged visual token and from its text model's last prompt state "
        "(where the report begins), beside the drafts' own d'",
    )
    parser.add_argument(
        "--gate",
        action="store_true",
        help="also judge the round again with this checkout's gate, on the round's own held-out set "
        "and on the test studies, and say whether the two verdicts agree",
    )
    parser.add_argument(
        "--agreement",
        action="store_true",
        help="also score both models' drafts at operating points of sample agreement (the app's 4 "
        "samples; a finding's sentence kept where at least 1-4 of them assert it too)",
    )
    return parser


def d_prime(recall: float, false_positive_rate: float, n: int = 200) -> float:
    """Binormal separability of a yes/no operating point, z(recall) + z(1 - FPR); rates clipped to 1/(2n)."""
    z = NormalDist().inv_cdf
    clip = 1 / (2 * n)
    return round(z(min(max(recall, clip), 1 - clip)) + z(min(max(1 - false_positive_rate, clip), 1 - clip)), 3)


def state_separability(model_dir, adapter, pictures: list, truth: np.ndarray, splits: int = 5) -> dict:
    """Held-out AUC of a ridge probe (60/40, `splits` random splits: mean and std) telling `truth` from the merged
    visual token (`orapo_core.models.features`, what drafting stores) and from the text model's last prompt state,
    and the AUCs' binormal d' (sqrt 2 * z(AUC)), comparable with the drafts' own."""
    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- tests patch Drafter

    drafter = Drafter.from_dir(model_dir, adapter)
    if hasattr(drafter.loaded.model, "merge_and_unload"):  # the merger hook needs the plain model's module names
        drafter.loaded.model = drafter.loaded.model.merge_and_unload()
    images = [Image.open(p).convert("RGB") for p in pictures]
    states = prompt_states(drafter.loaded.model, drafter.loaded.processor, drafter.prompt_text, images, batch=50)
    out = {}
    for what, x in (("merged_token", merged_tokens(drafter, images)), ("prompt_state", states)):
        aucs = []
        for r in range(splits):
            order = np.random.default_rng(r).permutation(len(truth))
            aucs.append(ridge_probe_auc(x[order], truth[order][:, None], int(0.6 * len(truth)))[0])
        mean = float(np.mean(aucs))
        out[what] = {
            "auc": round(mean, 4),
            "auc_std": round(float(np.std(aucs)), 4),
            "d_prime": round(2**0.5 * NormalDist().inv_cdf(min(mean, 1 - 1e-6)), 3),
        }
    return out


def changes_of_round(train_csv: Path) -> dict:
    """What a round's corrections did to each finding, from its training CSV: the signed report's stored labels
    against the FactS labels of the draft it replaced (`clinician_rejected`), as the round's selection counts them."""
    from app.services.rounds.evidence import finding_changes  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    def stored(row: dict) -> dict:
        return {k: parse_label(row.get(k)) for k in CHEXPERT_14}

    with open(train_csv, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("clinician_rejected")]
    return finding_changes((stored(r), label_report(r["clinician_rejected"])) for r in rows)


def judge_again(
    settings, database, round_id: int, base, adapter, test_rows: dict, overrides: dict | None = None
) -> dict:
    """This checkout's gate on the round's own held-out set (built and drafted as a round does now) and on the
    test studies' rows; both decisions (without the per-study rows) and whether their verdicts agree.
    `overrides`: round settings of the policy (`RoundPolicy`) to judge with instead of the defaults."""
    from app.services.rounds import RoundPolicy, decide  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.rounds.heldout import round_heldout  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.rounds.plan import EvaluationSpec, Weights  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.rounds.worker import evaluate_models  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    policy = RoundPolicy().updated(overrides or {})
    changes = changes_of_round(settings.rounds_dir / str(round_id) / "train.csv")
    heldout = round_heldout(database, settings, policy, changes)
    path = heldout.write(settings.rounds_dir / str(round_id) / "gate-again" / "heldout.json")
    evaluation = evaluate_models(
        EvaluationSpec(
            path, Weights(Path(base)), Weights(Path(base), Path(adapter)), min_agreement=settings.draft_min_agreement
        )
    )
    own = decide(evaluation.candidate.predictions, evaluation.served.predictions, policy.gate, changes=changes)
    test = decide(test_rows["candidate"], test_rows["before"], policy.gate, changes=changes)
    for name, d in (("own held-out set", own), ("test set", test)):
        print(f"gate on the {name}: {d.verdict}: {d.reason}")
    summary = heldout.summary()
    return {
        "changes": changes,
        "heldout": {"n": summary.n, "sources": summary.sources, "topped_up_for": summary.topped_up_for},
        "own": own.to_dict(),
        "test_set": test.to_dict(),
        "own_verdict": own.verdict,
        "test_verdict": test.verdict,
        "agree": own.verdict == test.verdict,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)

    from app.services.reading.served import resolve_path  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    data_dir, settings, database, version, base = open_round(args)
    if args.fit_verifier:
        from app.services.rounds import parse_settings  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

        add_max_fpr = parse_settings(args.set).get("finding_verifier_add_max_fpr")
        adapter = resolve_path(settings, version.adapter_path)
        print(f"finding verifier: {fit_version_verifier(settings, args.round, base, adapter, add_max_fpr=add_max_fpr)}")
    positives, negatives = test_studies(args)
    films = test_dir(data_dir)
    models = {"before": None, "candidate": resolve_path(settings, version.adapter_path)}
    result = {
        "command": command("bench_round_rescore", argv),
        "round": args.round,
        "checks": True,
        **{
            name: outcome(
                base, adapter, positives, negatives, args.finding, films, agreement=args.agreement, rows=args.gate
            )
            for name, adapter in models.items()
        },
    }
    if args.gate:
        rows = {name: result[name].pop("rows") for name in models}
        from app.services.rounds.policy import POLICY_KEYS, parse_settings  # noqa: PLC0415 -- loads sqlalchemy

        overrides = {k: v for k, v in parse_settings(args.set).items() if k in POLICY_KEYS}
        result["gate"] = judge_again(settings, database, args.round, base, models["candidate"], rows, overrides)
        result["gate"]["policy_overrides"] = overrides
    if args.state_probes:
        pictures = [
            r.image_paths[0]
            for r in phantom_test_records(positives, films, "pos") + phantom_test_records(negatives, films, "neg")
        ]
        truth = np.array([1.0] * len(positives) + [0.0] * len(negatives))
        for name, adapter in models.items():
            result[name]["state_probes"] = state_separability(base, adapter, pictures, truth)
            result[name]["state_probes"]["drafts_d_prime"] = d_prime(
                result[name]["recall"], result[name]["false_positive_rate"]
            )
            print(f"{name:10s} probe AUC, finding vs not: {result[name]['state_probes']}")
    return finish_tool(result, models, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
