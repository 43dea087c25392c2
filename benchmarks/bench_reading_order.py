"""Reading order and learning: corrections taken "most useful to the model first" against random order.

One clinic, three futures. A pool of `--pool` PhantomCXR studies at their usual
prevalence (rare findings at 2-5 %) is uploaded as DICOM and drafted by the
served starter through the app's services (`ingest_bytes`, `draft_study`: K
samples each, their self-consistency stored), once. The drafted clinic is then
copied three times, and in each copy a simulated radiologist signs the study's
reference report for the next unread study, in one of two orders:

- `random`: a seeded shuffle of the unread studies, `--budget` corrections;
- `useful`: the Worklist's "most useful to the model first" (`reading_order.ordered`,
  recomputed after every signature, since the served model's miss rates change
  as reports are signed), `--budget // 2` and `--budget` corrections.

Each copy then runs one round with the default policy and recipe (what
`orapo rounds run --wait` does). Every candidate, and the starter, is scored by
the one evaluator (`evaluate_drafter`, greedy drafts labelled by FactS) on test
studies the pool never holds: `--test-per-finding` studies carrying each rare
finding (pneumothorax moderate or large, fracture, lung lesion, pleural other)
and `--negatives` studies at usual prevalence without any of them. Reported:
recall of each rare finding, their mean (the rare-finding recall), false
positives of any rare finding on the negatives, macro-F1 over the 14, and how
many rare-finding studies each order put in front of the reader.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_reading_order [--pool 240] [--budget 80] [--json OUT]
    orapo bench reading_order

Goal (issue 15): the informed order with at most half the corrections reaches
the random order's final rare-finding recall.

`--reading-only` runs no round: it drafts the pool once and reports, for the
random order, the useful-first order, the useful-first order without its
atypicality term (`image_atypicality` off: the ordering of 2026-12-02's first
measurement), and without either image term (`finding_resemblance` off too: the
ordering before drafts kept their image features), how many studies with each
rare finding the reader had been shown after every `--every` corrections. That
is what the ordering controls; whether a round then learns from them is the
clinic story's question.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_reading_order --reading-only --pool 1000 --budget 300 --json OUT
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily

from benchmarks.round_story_common import draw, fit_version_verifier, phantom_test_records, report_of, write_dicoms
from orapo_core.data.phantom import generate_study
from orapo_core.models.starter import ensure_starter

RARE = {
    "pneumothorax": "Pneumothorax",
    "fracture": "Fracture",
    "lung_lesion": "Lung Lesion",
    "pleural_other": "Pleural Other",
}


def draft_pool(args, base: Path) -> dict[int, object]:
    """The drafted clinic in `base`: pool studies uploaded and drafted; returns study id -> PhantomCXR study."""
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.reading import drafting  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.reading.ingest import ingest_bytes  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from db import UserRepository  # noqa: PLC0415 -- loads sqlalchemy
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    settings = Settings(data_dir=base)
    database = open_database(settings)
    ensure_starter(settings.models_dir / "starter", show_progress=False)
    users = UserRepository(database)
    rad = users.create("rita", "rita-password-1")
    users.create("boss", "boss-password-1", role="admin")
    pool = [generate_study(np.random.default_rng([args.seed, i]), size=args.size) for i in range(args.pool)]
    files = write_dicoms(pool, base.parent / f"{base.name}-uploads", args.seed)
    by_id = {}
    for path, study in zip(files, pool):
        got = ingest_bytes(path.read_bytes(), path.name, db=database, settings=settings, user=rad, actor=rad.username)
        path.unlink()
        if not got.ok:
            raise SystemExit(f"upload refused: {got.message}")
        by_id[got.study_id] = study
    registry = drafting.ModelRegistry(settings, database)
    with ThreadPoolExecutor(8) as readers:  # readers drafting together share batched generates, as in the app
        list(readers.map(lambda sid: drafting.draft_study(database, settings, registry, rad, sid), by_id))
    database.engine.dispose()
    return by_id


def read_in_order(arm: Path, order: str, budget: int, by_id: dict, seed: int, every: int | None = None) -> dict:
    """Sign `budget` reference reports in `order` in the clinic copied to `arm`; what the reader was shown.

    `order` is 'random', 'useful', 'useful-no-atypical' (useful first without its atypicality term) or
    'useful-words' (without either image term); with `every`, the rare-finding studies read so far after every
    `every` corrections too."""
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.reading import reading_order, reports  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from db import StudyRepository, UserRepository  # noqa: PLC0415 -- loads sqlalchemy
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    settings = Settings(data_dir=arm)
    database = open_database(settings)
    rad = UserRepository(database).get_by_username("rita")
    studies = StudyRepository(database)
    shuffled = [int(i) for i in np.random.default_rng(seed).permutation(sorted(by_id))]
    read = []

    def rare_read():
        return {kind: sum(any(f.kind == kind for f in by_id[s].findings) for s in read) for kind in RARE}

    curve = []
    originals = reading_order.finding_resemblance, reading_order.image_atypicality
    if order in ("useful-words", "useful-no-atypical"):
        reading_order.image_atypicality = lambda unread, signed, stated=None: {}
    if order == "useful-words":
        reading_order.finding_resemblance = lambda signed: {}
    try:
        for _ in range(budget):
            if order == "random":
                study_id = shuffled[len(read)]
            else:
                unread = studies.list(status=list(reading_order.UNREAD), limit=100_000)
                study_id = reading_order.ordered(database, unread, "useful")[0].study.id
            reading_order.note_opened(database, rad, study_id, "oldest" if order == "random" else "useful")
            draft = studies.overview(study_id).latest_draft
            reports.save_report(
                database, rad, study_id, draft.id if draft else None, report_of(by_id[study_id]), sign=True
            )
            read.append(study_id)
            if every and len(read) % every == 0:
                curve.append({"corrections": len(read), **rare_read()})
    finally:
        reading_order.finding_resemblance, reading_order.image_atypicality = originals
    database.engine.dispose()
    out = {
        "order": order,
        "corrections": budget,
        "rare_studies_read": rare_read(),
        "any_rare_read": sum(any(f.kind in RARE for f in by_id[s].findings) for s in read),
    }
    if every:
        out["curve"] = curve
    return out


def run_round(arm: Path) -> dict:
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.reading.served import resolve_path  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.rounds import RoundService  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from db import ModelVersionRepository, UserRepository  # noqa: PLC0415 -- loads sqlalchemy
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    settings = Settings(data_dir=arm)
    os.environ["ORAPO_DATA_DIR"] = str(arm)  # the round's child processes read the same folder
    database = open_database(settings)
    admin = UserRepository(database).get_by_username("boss")
    started = time.perf_counter()
    finished = RoundService(database, settings).start_round(wait=True, actor=admin)
    version = next((v for v in ModelVersionRepository(database).list() if v.round_id == finished.id), None)
    out = {
        "status": finished.status,
        "error": finished.error,
        "minutes": round((time.perf_counter() - started) / 60, 1),
        "version_status": version.status if version else None,
        "gate": ((finished.metrics or {}).get("gate") or {}).get("reason"),
        "steps": ((finished.metrics or {}).get("train") or {}).get("step"),
    }
    if version is not None:
        out["model"] = (
            str(resolve_path(settings, version.base_model_path)),
            str(resolve_path(settings, version.adapter_path)) if version.adapter_path else None,
        )
    return out


def test_set(args) -> tuple[list, list]:
    """(studies, rare-finding kinds present in each) of the test studies, none of them in the pool."""
    studies, kinds = [], []
    for stream, kind in enumerate(RARE, start=1):
        for study in draw(args.test_per_finding, args.seed + 100 * stream, kind, True, args.size):
            studies.append(study)
            kinds.append({f.kind for f in study.findings} & set(RARE))
    i = 0
    while sum(not k for k in kinds) < args.negatives:
        study = generate_study(
            np.random.default_rng([args.seed + 999, i]), size=args.size, prevalence={kind: 0.0 for kind in RARE}
        )
        i += 1
        studies.append(study)
        kinds.append(set())
    return studies, kinds


def score(model: tuple[str, str | None], studies, kinds, folder: Path, *, checks: bool = True) -> dict:
    """Rare-finding recall, false positives and macro-F1 of `model`'s greedy drafts of the test studies, as the app
    drafts (`checks`: with the version's finding checks) or, with `checks=False`, what the model writes alone."""
    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- tests patch Drafter
    from orapo_core.models.evaluate import evaluate_drafter  # noqa: PLC0415 -- tests patch evaluate_drafter

    drafter = Drafter.from_dir(*model)
    if not checks:
        drafter.verifier = None
    result = evaluate_drafter(drafter, phantom_test_records(studies, folder, "test"))
    said = [{kind for kind, label in RARE.items() if p["labels"].get(label) in (1, -1)} for p in result.predictions]
    recall = {}
    for kind in RARE:
        positives = [i for i, k in enumerate(kinds) if kind in k]
        recall[kind] = sum(kind in said[i] for i in positives) / len(positives)
    negatives = [i for i, k in enumerate(kinds) if not k]
    return {
        "rare_recall": round(float(np.mean(list(recall.values()))), 4),
        "recall": {k: round(v, 4) for k, v in recall.items()},
        "rare_false_positive_rate": round(sum(bool(said[i]) for i in negatives) / len(negatives), 4),
        **result.metrics.headline(),
    }


def reading_only(args, root: Path, by_id: dict, report: dict, started: float) -> int:
    """The four orders' reading, no rounds; what each put in front of the reader, every `--every` corrections."""
    for order in ("random", "useful", "useful-no-atypical", "useful-words"):
        arm = root / order
        shutil.copytree(root / "clinic", arm)
        t0 = time.perf_counter()
        report["arms"][order] = read_in_order(arm, order, args.budget, by_id, args.seed, every=args.every)
        report["arms"][order]["seconds"] = round(time.perf_counter() - t0, 1)
        shutil.rmtree(arm, ignore_errors=True)
        print(
            f"{order}: {json.dumps(report['arms'][order]['rare_studies_read'])} "
            f"({report['arms'][order]['any_rare_read']} with any rare finding) in {args.budget} corrections",
            flush=True,
        )
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    arms = report["arms"]
    half = args.budget // 2
    at_half = {o: next((p for p in arms[o]["curve"] if p["corrections"] == half), None) for o in arms}
    print(f"\nrare-finding studies shown to the reader (pool {args.pool}: {report['pool_rare']}):")
    print(f"{'corrections':>11} " + " ".join(f"{o:>28}" for o in arms))
    for i, point in enumerate(arms["random"]["curve"]):
        cells = []
        for o in arms:
            p = arms[o]["curve"][i]
            cells.append(f"{sum(p[k] for k in RARE):>4} (" + "/".join(str(p[k]) for k in RARE) + ")")
        print(f"{point['corrections']:>11} " + " ".join(f"{c:>28}" for c in cells))
    print(
        "(per order: the four summed, a study with two counted twice; then pneumothorax/fracture/lung lesion/"
        "pleural other)"
    )
    if all(at_half.values()):
        random_final = arms["random"]["rare_studies_read"]
        for o in ("useful", "useful-no-atypical", "useful-words"):
            met = {k: at_half[o][k] >= random_final[k] for k in RARE}
            report.setdefault("half_budget_reaches_random", {})[o] = met
            print(f"{o} with {half} corrections shows as many as random with {args.budget}: {met}")
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(f"command: {report['command']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=int, default=240, help="unread studies in the clinic, at usual prevalence")
    parser.add_argument("--budget", type=int, default=80, help="corrections in the random arm (useful: half and all)")
    parser.add_argument("--test-per-finding", type=int, default=30)
    parser.add_argument("--negatives", type=int, default=60)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--data-dir", default=None, help="a fresh folder for the clinic and its copies")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--reading-only",
        action="store_true",
        help="no rounds: how many rare-finding studies each order shows the reader (see above)",
    )
    parser.add_argument("--every", type=int, default=25, help="with --reading-only: a point every N corrections")
    parser.add_argument(
        "--arms",
        default=None,
        help="comma-separated ORDER-CORRECTIONS arms to run (default: random-B,useful-B/2,useful-B), "
        "so that arms can run in separate processes, one per core",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="combine the arms of runs with the same pool, seed and budget into one report (--json)",
    )
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="in an existing --data-dir with the same --seed and --arms: fit each arm's round verifier "
        "again as a round now fits it, and score the arm's candidate again on the same test "
        "studies (no drafting of the pool, no new round)",
    )
    parser.add_argument(
        "--alone",
        action="store_true",
        help="with --rescore: score each arm's candidate with its finding checks set aside (what the model writes "
        "alone), fitting nothing again",
    )
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args)
    if args.rescore:
        if not (args.data_dir and args.arms):
            parser.error("--rescore needs the --data-dir and --arms of the run it scores again")
        return rescore(args)

    root = Path(args.data_dir or tempfile.mkdtemp(prefix="orapo-order-"))
    root.mkdir(parents=True, exist_ok=True)
    report = {
        "command": "python -m benchmarks.bench_reading_order " + " ".join(argv if argv is not None else sys.argv[1:]),
        "pool": args.pool,
        "budget": args.budget,
        "arms": {},
    }
    started = time.perf_counter()
    by_id = draft_pool(args, root / "clinic")
    report["pool_seconds"] = round(time.perf_counter() - started, 1)
    report["pool_rare"] = {kind: sum(any(f.kind == kind for f in s.findings) for s in by_id.values()) for kind in RARE}
    print(
        f"pool: {args.pool} studies drafted in {report['pool_seconds']} s; rare findings in it: {report['pool_rare']}",
        flush=True,
    )

    if args.reading_only:
        return reading_only(args, root, by_id, report, started)
    studies, kinds = test_set(args)

    starter = ensure_starter(root / "clinic" / "models" / "starter", show_progress=False)
    report["starter"] = score((str(starter), None), studies, kinds, root / "test")
    print(f"starter: {report['starter']}", flush=True)
    arms = (
        [(order, int(n)) for order, n in (a.rsplit("-", 1) for a in args.arms.split(","))]
        if args.arms
        else [("random", args.budget), ("useful", args.budget // 2), ("useful", args.budget)]
    )
    for order, budget in arms:
        name = f"{order}-{budget}"
        arm = root / name
        shutil.copytree(root / "clinic", arm)
        arm_report = read_in_order(arm, order, budget, by_id, args.seed)
        arm_report["round"] = run_round(arm)
        if "model" in arm_report["round"]:
            arm_report["outcome"] = score(arm_report["round"]["model"], studies, kinds, root / "test")
        report["arms"][name] = arm_report
        print(f"{name}: {json.dumps(arm_report, default=str)}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))

    goal(report, args.budget)
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(f"command: {report['command']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


def rescore(args) -> int:
    """Each arm's candidate scored again, its finding verifier fitted again by today's `fit_round_verifier` on the
    round's own train.csv (`round_story_common.fit_version_verifier`), on the same test studies."""
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.reading.served import resolve_path  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from db import ModelVersionRepository  # noqa: PLC0415 -- loads sqlalchemy
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    root = Path(args.data_dir)
    studies, kinds = test_set(args)
    report = {"command": "python -m benchmarks.bench_reading_order " + " ".join(sys.argv[1:]), "arms": {}}
    for name in args.arms.split(","):
        arm = root / name
        settings = Settings(data_dir=arm)
        os.environ["ORAPO_DATA_DIR"] = str(arm)
        version = next(v for v in ModelVersionRepository(open_database(settings)).list() if v.round_id == 1)
        base, adapter = resolve_path(settings, version.base_model_path), resolve_path(settings, version.adapter_path)
        if args.alone:  # the candidate as it is, its finding checks set aside: nothing is fitted again
            report["arms"][name] = {
                "alone": score((str(base), str(adapter)), studies, kinds, root / "test", checks=False)
            }
        else:
            verifier = fit_version_verifier(settings, 1, base, adapter)
            report["arms"][name] = {
                "verifier": verifier,
                "outcome": score((str(base), str(adapter)), studies, kinds, root / "test"),
            }
        print(f"{name}: {json.dumps(report['arms'][name], default=str)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


def merge(args) -> int:
    """One report from runs that each ran some of the arms on the same drafted pool and test set."""
    runs = [json.loads(Path(p).read_text()) for p in args.merge]
    report = dict(runs[0], arms={}, merged_from=[r["command"] for r in runs])
    for r in runs:
        if (r["pool"], r["budget"], r.get("pool_rare")) != (report["pool"], report["budget"], report.get("pool_rare")):
            raise SystemExit(f"{r['command']}: another pool or budget than {report['command']}")
        report["arms"].update(r["arms"])
    goal(report, report["budget"])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


def goal(report: dict, budget: int) -> None:
    """Whether the useful order with half the corrections reached the random order's rare-finding recall."""
    arms = report["arms"]
    random_final = arms.get(f"random-{budget}", {}).get("outcome", {}).get("rare_recall")
    half = arms.get(f"useful-{budget // 2}", {}).get("outcome", {}).get("rare_recall")
    if random_final is not None and half is not None:
        if random_final == 0:  # 0 >= 0 would read as "met": there was nothing to reach
            report["goal_informed_half_reaches_random"] = None
            print(
                "goal: undecided: the random order's round learned no rare finding (rare-finding recall 0), so "
                "there is no figure for the informed order to reach"
            )
        else:
            report["goal_informed_half_reaches_random"] = half >= random_final
            print(
                f"goal: useful order with {budget // 2} corrections reaches the random order's rare-finding "
                f"recall with {budget} ({half:.3f} vs {random_final:.3f}): "
                f"{'met' if half >= random_final else 'MISSED'}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
