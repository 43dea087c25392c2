"""The clinic story: readers correct a finding the starter never reports; after one default round, is it reported?

A fresh data folder and the app's own services, nothing else: `--n` PhantomCXR
studies that all carry the finding (pneumothorax, moderate or large, by
default) are uploaded as DICOM by a radiologist (`ingest_bytes`, as the Read
tab does), drafted by the served model (`draft_study`), corrected with the
study's reference report and signed (`save_report`). About a tenth of them are
held out by the app's own split (never trained on; the gate's held-out set).
Then one round runs with the default policy and recipe (`RoundService.start_round`,
what `orapo rounds run --wait` does) and the benchmark reports whether the gate
promoted the candidate, the round's wall time, and, on studies the round never
saw, the served model before and after: recall of the finding on `--n-positive`
new studies with it, the false-positive rate on `--n-negative` studies without
it, and 14-observation macro-F1 over both sets (drafts labelled by FactS,
references: PhantomCXR's own labels).

    .venv/bin/python benchmarks/bench_round_story.py [--finding pneumothorax] [--json OUT.json]
    orapo bench round_story

Goals (issue 11): promoted; recall >= 0.6; FPR <= 0.05; macro-F1 not lower; round <= 30 min on 2 cores; read
from the drafts the app shows: at its operating point ORAPO_DRAFT_MIN_AGREEMENT, whose 4 samples per draft also
give, with `--agreement` or a non-zero operating point, the scores at 1 to 4 of 4 from the same drafts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEVERE = {"pneumothorax": ("moderate", "large"), "pleural_effusion": ("moderate", "large")}
LABEL = {"pneumothorax": "Pneumothorax", "pleural_effusion": "Pleural Effusion", "fracture": "Fracture",
         "lung_lesion": "Lung Lesion", "pleural_other": "Pleural Other"}


def draw(n: int, stream: int, finding: str, present: bool, size: int):
    """`n` PhantomCXR studies with (the severe form of) `finding`, or without it; the rest at usual prevalence."""
    from orapo_core.data.phantom import generate_study

    out, i = [], 0
    while len(out) < n:
        study = generate_study(np.random.default_rng([stream, i]), size=size, prevalence={finding: 1.0 if present else 0.0})
        i += 1
        if present and finding in SEVERE and not any(
                f.kind == finding and f.severity in SEVERE[finding] for f in study.findings):
            continue
        out.append(study)
    return out


def write_dicoms(studies, folder: Path, seed: int) -> list[Path]:
    """The studies as PhantomCXR DICOMs (with fake identities, which ingest must remove), one file each."""
    from orapo_core.data.phantom_io import write_dicom

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, study in enumerate(studies):
        path = folder / f"study{i:04d}.dcm"
        write_dicom(path, study.image, study.view, seed, i)
        paths.append(path)
    return paths


def report_of(study) -> str:
    from orapo_core.report_layout import report_text

    return report_text(study.report_findings, study.report_impression)


def phantom_test_records(studies, folder: Path, tag: str) -> list:
    """PhantomCXR `studies` as test StudyRecords of PNG films in `folder` (written once), ids `<tag>-<i>`."""
    from PIL import Image

    from orapo_core.data.records import StudyRecord

    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for i, s in enumerate(studies):
        path = folder / f"{tag}-{i}.png"
        if not path.exists():
            Image.fromarray(np.round(s.image * 255).astype(np.uint8)).save(path)
        records.append(StudyRecord(study_id=f"{tag}-{i}", image_paths=[path], view=None, findings=s.report_findings,
                                   impression=s.report_impression, labels=dict(s.labels), source="phantomcxr",
                                   split="test"))
    return records


def grpo_twin_dir(data_dir: Path, round_id: int) -> Path:
    """Where `--grpo-from-round ID` keeps GRPO trained on that round's own rows, recipe and steps."""
    return data_dir / f"grpo-from-round-{round_id}"


AGREEMENT = (0.25, 0.5, 0.75, 1.0)  # operating points read from the same drafts: 1 to 4 of the app's 4 samples


def outcome(model_dir, adapter, positives, negatives, finding: str, folder: Path, *, agreement: bool = False,
            checks: bool = True) -> dict:
    """Greedy drafts of the one evaluator on PNGs of the test studies: recall, FPR and macro-F1.

    `checks=False` sets the version's finding checks aside (orapo_core.models.verifier): what the model writes alone.

    With `agreement`, the same drafts are also drawn with the app's 4 samples each, and scored again at each
    operating point of `AGREEMENT`: a finding's sentence kept only where at least that share of the samples
    assert it too (`orapo_core.facts.keep_agreed`), under "agreement". The app's drafts are the one at its
    `ORAPO_DRAFT_MIN_AGREEMENT` (`shown`)."""
    from orapo_core.facts import keep_agreed
    from orapo_core.models.draft import Drafter
    from orapo_core.models.evaluate import evaluate_drafter, rescore

    records = phantom_test_records(positives, folder, "pos") + phantom_test_records(negatives, folder, "neg")
    drafter = Drafter.from_dir(model_dir, adapter)
    if not checks:
        drafter.verifier = None
    result = evaluate_drafter(drafter, records, samples=4 if agreement else 0)
    out = _rates(result, len(positives), finding)
    if agreement:
        out["agreement"] = {
            str(q): _rates(rescore(result, records, lambda row, q=q: keep_agreed(row["draft"], row["samples"], q)),
                           len(positives), finding)
            for q in AGREEMENT}
    return out


def shown(scores: dict, min_agreement: float) -> dict:
    """The scores of the drafts the app shows at `min_agreement` (ORAPO_DRAFT_MIN_AGREEMENT; 0: greedy)."""
    return scores["agreement"][str(min_agreement)] if min_agreement else scores


def _rates(result, n_positive: int, finding: str) -> dict:
    label = LABEL[finding]
    said = [r["labels"].get(label) in (1, -1) for r in result.predictions]
    pos = said[:n_positive]
    neg = said[n_positive:]
    return {"recall": sum(pos) / len(pos), "false_positive_rate": sum(neg) / len(neg),
            "macro_f1_14": result.metrics["macro_f1_14"], "macro_precision_14": result.metrics.get("macro_precision_14"),
            "macro_recall_14": result.metrics.get("macro_recall_14"), "n_positive": len(pos), "n_negative": len(neg),
            **false_positives_by_finding(result.predictions[n_positive:], neg)}


def false_positives_by_finding(rows: list[dict], said: list[bool]) -> dict:
    """Where the false positives are: on the studies without the finding, [false positives, studies] among the
    normal ones (no other finding present in the reference) and among those with each other finding."""
    normal, by_finding = [0, 0], {}
    for row, positive in zip(rows, said):
        present = [k for k, v in (row.get("reference") or {}).items() if v == 1 and k != "No Finding"]
        for key in present:
            counts = by_finding.setdefault(key, [0, 0])
            counts[0] += positive
            counts[1] += 1
        if not present:
            normal[0] += positive
            normal[1] += 1
    return {"false_positives_on_normal": normal, "false_positives_by_finding": dict(sorted(by_finding.items()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finding", default="pneumothorax", choices=sorted(LABEL))
    parser.add_argument("--n", type=int, default=168, help="studies corrected in the clinic (about 10%% held out)")
    parser.add_argument("--n-positive", type=int, default=125)
    parser.add_argument("--n-negative", type=int, default=200)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--data-dir", default=None, help="fresh data folder (default: a temporary one)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="round settings (default: none, the point is the defaults)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--grpo-from-round", type=int, default=None, metavar="ID",
                        help="in an existing --data-dir: train GRPO (oracle_mode none) on round ID's own train.csv with "
                             "its recipe and step budget, and score it on the same test studies (OraPO vs GRPO)")
    parser.add_argument("--rescore-round", type=int, default=None, metavar="ID",
                        help="in an existing --data-dir (same --seed): score round ID's candidate and the model it "
                             "started from again on the same test studies, with no new round (e.g. for the false "
                             "positives' breakdown by the negatives' other findings)")
    parser.add_argument("--fit-verifier", action="store_true",
                        help="with --rescore-round: first fit the finding verifier of that round's version as a round "
                             "with finding_verifier on does (orapo_core.models.verifier.fit_round_verifier, on the "
                             "round's own train.csv; --set finding_verifier_add_max_fpr=0 fits it without its additions), "
                             "save it beside the version's adapter, then score")
    parser.add_argument("--state-probes", action="store_true",
                        help="with --rescore-round: also how well a linear probe tells the test films with the finding "
                             "from those without, from each model's merged visual token and from its text model's "
                             "last prompt state (where the report begins), beside the drafts' own d'")
    parser.add_argument("--drafts-alone", action="store_true",
                        help="with --rescore-round: score the drafts with the versions' finding checks set aside (what "
                             "each model writes by itself); the GRPO twin of --grpo-from-round, when the folder has it, "
                             "is scored the same way beside the candidate")
    parser.add_argument("--agreement", action="store_true",
                        help="also score both models' drafts at operating points of sample agreement (the app's 4 "
                             "samples; a finding's sentence kept where at least 1-4 of them assert it too)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import os

    from app.runtime import open_database
    from app.services import drafting, reports
    from app.services.ingest import ingest_bytes
    from app.services.rounds import RoundService
    from app.services.rounds import parse_settings
    from app.services.served import served_model
    from db import ModelVersionRepository, UserRepository
    from orapo_core.config import Settings
    from orapo_core.models.starter import ensure_starter

    if args.grpo_from_round is not None:
        return grpo_comparison(args)
    if args.rescore_round is not None:
        return rescore_round(args)
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="orapo-story-"))
    settings = Settings(data_dir=data_dir)
    os.environ["ORAPO_DATA_DIR"] = str(data_dir)  # the round's child processes read the same folder
    database = open_database(settings)
    ensure_starter(settings.models_dir / "starter", show_progress=False)
    users = UserRepository(database)
    rad = users.create("rita", "rita-password-1")
    admin = users.create("boss", "boss-password-1", role="admin")
    report = {"command": "benchmarks/bench_round_story.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "finding": args.finding, "data_dir": str(data_dir),
              "draft_min_agreement": settings.draft_min_agreement}  # the operating point the app drafts at
    shown_at = settings.draft_min_agreement
    if shown_at and shown_at not in AGREEMENT:
        raise SystemExit(f"ORAPO_DRAFT_MIN_AGREEMENT={shown_at} is not one of the operating points {AGREEMENT}")
    args.agreement = args.agreement or bool(shown_at)

    started = time.perf_counter()
    clinic = draw(args.n, args.seed, args.finding, True, args.size)
    files = write_dicoms(clinic, data_dir.parent / f"{data_dir.name}-uploads", args.seed)
    registry = drafting.ModelRegistry(settings, database)
    said_before, split = 0, {"train": 0, "holdout": 0}
    for path, study in zip(files, clinic):
        got = ingest_bytes(path.read_bytes(), path.name, db=database, settings=settings, user=rad, actor=rad.username)
        path.unlink()
        if not got.ok:
            raise SystemExit(f"upload refused: {got.message}")
        draft = drafting.draft_study(database, settings, registry, rad, got.study_id)
        from orapo_core.facts import label_report

        said_before += label_report(draft.text).get(LABEL[args.finding]) in (1, -1)
        saved = reports.save_report(database, rad, got.study_id, draft.id, report_of(study), sign=True)
        split[drafting.open_study(database, rad, saved.study_id).study.split] += 1
    report["clinic"] = {"studies": args.n, "drafts_with_finding": said_before, **split,
                        "seconds": round(time.perf_counter() - started, 1)}
    print(f"clinic: {args.n} studies uploaded, drafted ({said_before} drafts called {args.finding}), corrected and "
          f"signed ({split['train']} train / {split['holdout']} held out) in {report['clinic']['seconds']} s", flush=True)

    before = served_model(database, settings)
    service = RoundService(database, settings)
    started = time.perf_counter()
    finished = service.start_round(wait=True, actor=admin, settings=parse_settings(args.set))
    wall = time.perf_counter() - started
    version = next((v for v in ModelVersionRepository(database).list() if v.round_id == finished.id), None)
    gate = (finished.metrics or {}).get("gate") or {}
    report["round"] = {"id": finished.id, "status": finished.status, "error": finished.error,
                       "version_status": version.status if version else None, "gate": gate.get("reason"),
                       "seconds": round(wall, 1), "train": (finished.metrics or {}).get("train", {}),
                       "selection": {k: (len(v) if isinstance(v, list) else v)
                                     for k, v in ((finished.metrics or {}).get("selection") or {}).items()}}
    print(f"round {finished.id}: {finished.status}, version {version.status if version else None} in {wall / 60:.1f} min; "
          f"gate: {gate.get('reason') or finished.error}", flush=True)

    positives = draw(args.n_positive, args.seed + 1, args.finding, True, args.size)
    negatives = draw(args.n_negative, args.seed + 2, args.finding, False, args.size)
    test_dir = data_dir.parent / f"{data_dir.name}-test"
    report["before"] = outcome(before.model_dir, before.adapter_dir, positives, negatives, args.finding, test_dir,
                               agreement=args.agreement)
    if version is not None:
        from app.services.served import resolve_path

        report["candidate"] = outcome(resolve_path(settings, version.base_model_path),
                                      resolve_path(settings, version.adapter_path), positives, negatives, args.finding,
                                      test_dir, agreement=args.agreement)
    for name in ("before", "candidate"):
        if name in report:
            r = report[name]
            print(f"{name:10s} recall {r['recall']:.3f} ({r['n_positive']} with {args.finding}), false-positive rate "
                  f"{r['false_positive_rate']:.3f} ({r['n_negative']} without), macro-F1(14) {r['macro_f1_14']:.3f}")
            for q, a in (r.get("agreement") or {}).items():
                print(f"{'':10s} kept where >= {float(q):.2f} of samples agree: recall {a['recall']:.3f}, "
                      f"false-positive rate {a['false_positive_rate']:.3f}, macro-F1(14) {a['macro_f1_14']:.3f}")
    if "candidate" in report:
        # the goals are read from the drafts the app shows: at its operating point, the greedy ones at 0
        c, b = (shown(report["candidate"], shown_at), shown(report["before"], shown_at))
        report["goals"] = {"promoted": version.status == "promoted", "recall>=0.6": c["recall"] >= 0.6,
                           "fpr<=0.05": c["false_positive_rate"] <= 0.05,
                           "macro_f1_not_lower": c["macro_f1_14"] >= b["macro_f1_14"], "round<=30min": wall <= 1800}
        print("goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in report["goals"].items()))
    print(f"command: {report['command']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


def grpo_comparison(args) -> int:
    """GRPO on exactly the rows and steps an OraPO round trained on; the same outcome measures."""
    import os
    import subprocess

    from app.runtime import open_database
    from app.services.served import resolve_path
    from app.services.rounds.processes import override_argv
    from db import ModelVersionRepository, RoundRepository
    from orapo_core.config import Settings

    data_dir = Path(args.data_dir)
    settings = Settings(data_dir=data_dir)
    os.environ["ORAPO_DATA_DIR"] = str(data_dir)
    database = open_database(settings)
    record = RoundRepository(database).get(args.grpo_from_round)
    folder = data_dir / "rounds" / str(record.id)
    version = next(v for v in ModelVersionRepository(database).list() if v.round_id == record.id)
    base = resolve_path(settings, version.base_model_path)
    out = grpo_twin_dir(data_dir, record.id)
    overrides = {**record.config.get("overrides", {}), "model_name_or_path": base, "train_csv": str(folder / "train.csv"),
                 "output_dir": str(out), "oracle_mode": "none", "use_clinician_pairs": False}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "app.cli", "train", "--config", record.config["recipe"],
                    *override_argv(overrides)], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    positives = draw(args.n_positive, args.seed + 1, args.finding, True, args.size)
    negatives = draw(args.n_negative, args.seed + 2, args.finding, False, args.size)
    test_dir = data_dir.parent / f"{data_dir.name}-test"
    result = {"grpo": outcome(base, out, positives, negatives, args.finding, test_dir), "grpo_seconds": round(seconds, 1),
              "oraPO_round": record.id, "command": "benchmarks/bench_round_story.py " + " ".join(sys.argv[1:])}
    r = result["grpo"]
    print(f"GRPO, same rows and steps as round {record.id}: recall {r['recall']:.3f}, false-positive rate "
          f"{r['false_positive_rate']:.3f}, macro-F1(14) {r['macro_f1_14']:.3f} ({seconds / 60:.1f} min training)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


def d_prime(recall: float, false_positive_rate: float, n: int = 200) -> float:
    """Binormal separability of a yes/no operating point, z(recall) + z(1 - FPR); rates clipped to 1/(2n)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf
    clip = 1 / (2 * n)
    return round(z(min(max(recall, clip), 1 - clip)) + z(min(max(1 - false_positive_rate, clip), 1 - clip)), 3)


def state_separability(model_dir, adapter, pictures: list, truth: np.ndarray, splits: int = 5) -> dict:
    """Held-out AUC of a ridge probe (60/40, `splits` random splits: mean and std) telling `truth` from the merged
    visual token (`orapo_core.models.features`, what drafting stores) and from the text model's last prompt state,
    and the AUCs' binormal d' (sqrt 2 * z(AUC)), comparable with the drafts' own."""
    from statistics import NormalDist

    from PIL import Image

    from benchmarks.bench_finding_evidence import merged_tokens
    from benchmarks.bench_probe import ridge_probe_auc
    from orapo_core.models.draft import Drafter
    from orapo_core.models.verifier import prompt_states

    drafter = Drafter.from_dir(model_dir, adapter)
    if hasattr(drafter.loaded.model, "merge_and_unload"):  # the merger hook needs the plain model's module names
        drafter.loaded.model = drafter.loaded.model.merge_and_unload()
    images = [Image.open(p).convert("RGB") for p in pictures]
    states = prompt_states(drafter.loaded.model, drafter.loaded.processor, drafter._prompt_text, images, batch=50)
    out = {}
    for what, x in (("merged_token", merged_tokens(drafter, images)), ("prompt_state", states)):
        aucs = []
        for r in range(splits):
            order = np.random.default_rng(r).permutation(len(truth))
            aucs.append(ridge_probe_auc(x[order], truth[order][:, None], int(0.6 * len(truth)))[0])
        mean = float(np.mean(aucs))
        out[what] = {"auc": round(mean, 4), "auc_std": round(float(np.std(aucs)), 4),
                     "d_prime": round(2 ** 0.5 * NormalDist().inv_cdf(min(mean, 1 - 1e-6)), 3)}
    return out


def fit_version_verifier(settings, round_id: int, base, adapter, *, add_max_fpr: float | None = None) -> dict:
    """Fit and save the finding verifier of round `round_id`'s version, from the round's own train.csv and recipe
    (`add_max_fpr`: the round setting finding_verifier_add_max_fpr, None the verifier's default; 0 adds nothing)."""
    from types import SimpleNamespace

    from orapo_core.models.loading import load_model
    from orapo_core.models.verifier import ADD_MAX_FPR, describe, fit_round_verifier
    from orapo_core.train.dataset import load_round_dataset

    recipe = json.loads((Path(adapter) / "orapo_recipe.json").read_text())["script"]
    recipe["train_csv"] = str(settings.resolved_data_dir / "rounds" / str(round_id) / "train.csv")
    dataset = load_round_dataset(SimpleNamespace(**recipe))
    loaded = load_model(base, adapter)
    with loaded.using() as model:
        verifier = fit_round_verifier(model, loaded.processor, dataset, prompt=recipe.get("prompt_text"),
                                      add_max_fpr=ADD_MAX_FPR if add_max_fpr is None else float(add_max_fpr))
    if verifier is not None:
        verifier.save(adapter)
    return describe(verifier)


def rescore_round(args) -> int:
    """Round ID's candidate and its starting model, scored again on the same test studies (no training)."""
    import os

    from app.runtime import open_database
    from app.services.served import resolve_path
    from db import ModelVersionRepository
    from orapo_core.config import Settings

    data_dir = Path(args.data_dir)
    settings = Settings(data_dir=data_dir)
    os.environ["ORAPO_DATA_DIR"] = str(data_dir)
    version = next(v for v in ModelVersionRepository(open_database(settings)).list() if v.round_id == args.rescore_round)
    base = resolve_path(settings, version.base_model_path)
    if args.fit_verifier:
        from app.services.rounds import parse_settings

        add_max_fpr = parse_settings(args.set).get("finding_verifier_add_max_fpr")
        adapter = resolve_path(settings, version.adapter_path)
        print(f"finding verifier: {fit_version_verifier(settings, args.rescore_round, base, adapter, add_max_fpr=add_max_fpr)}")
    positives = draw(args.n_positive, args.seed + 1, args.finding, True, args.size)
    negatives = draw(args.n_negative, args.seed + 2, args.finding, False, args.size)
    test_dir = data_dir.parent / f"{data_dir.name}-test"
    models = {"before": None, "candidate": resolve_path(settings, version.adapter_path)}
    twin = grpo_twin_dir(data_dir, args.rescore_round)
    if args.drafts_alone and (twin / "adapter_config.json").is_file():
        models["grpo"] = twin
    result = {"command": "benchmarks/bench_round_story.py " + " ".join(sys.argv[1:]), "round": args.rescore_round,
              "checks": not args.drafts_alone,
              **{name: outcome(base, adapter, positives, negatives, args.finding, test_dir, agreement=args.agreement,
                               checks=not args.drafts_alone) for name, adapter in models.items()}}
    if args.state_probes:
        pictures = [r.image_paths[0] for r in phantom_test_records(positives, test_dir, "pos")
                    + phantom_test_records(negatives, test_dir, "neg")]
        truth = np.array([1.0] * len(positives) + [0.0] * len(negatives))
        for name, adapter in models.items():
            result[name]["state_probes"] = state_separability(base, adapter, pictures, truth)
            result[name]["state_probes"]["drafts_d_prime"] = d_prime(result[name]["recall"],
                                                                     result[name]["false_positive_rate"])
            print(f"{name:10s} probe AUC, finding vs not: {result[name]['state_probes']}")
    for name in models:
        r = result[name]
        worst = sorted(r["false_positives_by_finding"].items(), key=lambda kv: -kv[1][0] / kv[1][1])[:4]
        print(f"{name:10s} recall {r['recall']:.3f}, false-positive rate {r['false_positive_rate']:.3f} "
              f"(normal films {r['false_positives_on_normal'][0]}/{r['false_positives_on_normal'][1]}; "
              + ", ".join(f"with {k} {a}/{n}" for k, (a, n) in worst) + ")")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
