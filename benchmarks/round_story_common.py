"""What the clinic-story tools share: their PhantomCXR studies, the data folder a story leaves, and the one outcome.

The clinic story (`benchmarks.bench_round_story`) leaves a data folder with a round in it; the tools that read
such a folder again (`bench_round_rescore`, `bench_round_drafts_alone`, `bench_round_grpo_twin`) draw the same
test studies from the same `--seed` and score models with the same `outcome`: recall of the finding on studies
with it, the false-positive rate on studies without it, and 14-observation macro-F1 over both sets (drafts
labelled by FactS, references: PhantomCXR's own labels). `bench_reading_order` and `bench_finding_evidence`
draw their studies here too.

Not a benchmark itself: it has no command line.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image

from orapo_core.data.phantom import generate_study
from orapo_core.data.phantom_io import write_dicom
from orapo_core.data.records import StudyRecord
from orapo_core.facts import keep_agreed
from orapo_core.facts.metrics import EvalMetrics
from orapo_core.models.evaluate import rescore
from orapo_core.models.loading import load_model
from orapo_core.models.verifier import ADD_MAX_FPR, describe, fit_round_verifier
from orapo_core.report_layout import report_text
from orapo_core.train.dataset import load_round_dataset

SEVERE = {"pneumothorax": ("moderate", "large"), "pleural_effusion": ("moderate", "large")}
LABEL = {
    "pneumothorax": "Pneumothorax",
    "pleural_effusion": "Pleural Effusion",
    "fracture": "Fracture",
    "lung_lesion": "Lung Lesion",
    "pleural_other": "Pleural Other",
}
AGREEMENT = (0.25, 0.5, 0.75, 1.0)  # operating points read from the same drafts: 1 to 4 of the app's 4 samples


def command(module: str, argv: list[str]) -> str:
    """The command line that ran benchmark `module` (e.g. `bench_round_story`) with `argv`, for its results."""
    return " ".join(["python -m benchmarks." + module, *argv])


# --- the studies -----------------------------------------------------------------------------------------------


def draw(n: int, stream: int, finding: str, present: bool, size: int):
    """`n` PhantomCXR studies with (the severe form of) `finding`, or without it; the rest at usual prevalence."""
    out, i = [], 0
    while len(out) < n:
        study = generate_study(
            np.random.default_rng([stream, i]), size=size, prevalence={finding: 1.0 if present else 0.0}
        )
        i += 1
        if (
            present
            and finding in SEVERE
            and not any(f.kind == finding and f.severity in SEVERE[finding] for f in study.findings)
        ):
            continue
        out.append(study)
    return out


def write_dicoms(studies, folder: Path, seed: int) -> list[Path]:
    """The studies as PhantomCXR DICOMs (with fake identities, which ingest must remove), one file each."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, study in enumerate(studies):
        path = folder / f"study{i:04d}.dcm"
        write_dicom(path, study.image, study.view, seed, i)
        paths.append(path)
    return paths


def report_of(study) -> str:
    return report_text(study.report_findings, study.report_impression)


def phantom_test_records(studies, folder: Path, tag: str) -> list:
    """PhantomCXR `studies` as test StudyRecords of PNG films in `folder` (written once), ids `<tag>-<i>`."""
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for i, s in enumerate(studies):
        path = folder / f"{tag}-{i}.png"
        if not path.exists():
            Image.fromarray(np.round(s.image * 255).astype(np.uint8)).save(path)
        records.append(
            StudyRecord(
                study_id=f"{tag}-{i}",
                image_paths=[path],
                view=None,
                findings=s.report_findings,
                impression=s.report_impression,
                labels=dict(s.labels),
                source="phantomcxr",
                split="test",
            )
        )
    return records


def add_test_set_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that pick the finding and the test studies (the same `--seed` draws the same studies)."""
    parser.add_argument("--finding", default="pneumothorax", choices=sorted(LABEL))
    parser.add_argument("--n-positive", type=int, default=125)
    parser.add_argument("--n-negative", type=int, default=200)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument(
        "--seed",
        type=int,
        default=11,
        help="the clinic story's seed: its clinic is drawn from stream S, its test studies from S+1 "
        "(with the finding) and S+2 (without)",
    )


def test_studies(args: argparse.Namespace) -> tuple[list, list]:
    """The test studies of a clinic story of `args.seed`: `--n-positive` with the finding, `--n-negative` without."""
    positives = draw(args.n_positive, args.seed + 1, args.finding, True, args.size)
    negatives = draw(args.n_negative, args.seed + 2, args.finding, False, args.size)
    return positives, negatives


def test_dir(data_dir: Path) -> Path:
    """Where a story's test films are written (beside its data folder, never inside it)."""
    return data_dir.parent / f"{data_dir.name}-test"


# --- a story's data folder -------------------------------------------------------------------------------------


def add_story_folder_arguments(parser: argparse.ArgumentParser, round_help: str) -> None:
    """`--data-dir` and `--round` of a tool that reads a clinic story's folder again."""
    parser.add_argument(
        "--data-dir",
        required=True,
        help="the data folder of a clinic story (`benchmarks.bench_round_story --data-dir`); "
        "pass its --seed too, so the test studies are the same",
    )
    parser.add_argument("--round", type=int, default=1, metavar="ID", help=round_help)


def open_story(data_dir: Path):
    """The settings and database of a story's data folder; a round's child processes read the same folder."""
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    settings = Settings(data_dir=data_dir)
    os.environ["ORAPO_DATA_DIR"] = str(data_dir)
    return settings, open_database(settings)


def make_tool_parser(doc: str, round_help: str) -> argparse.ArgumentParser:
    """The arguments every round tool takes: the story's folder and round, the test set, and where the JSON goes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_story_folder_arguments(parser, round_help)
    add_test_set_arguments(parser)
    parser.add_argument("--json", default=None)
    return parser


def open_round(args: argparse.Namespace):
    """(the story's folder, its settings, its database, the round's model version, that version's base model) for a
    tool's --data-dir and --round."""
    from app.services.reading.served import resolve_path  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    data_dir = Path(args.data_dir)
    settings, database = open_story(data_dir)
    version = round_version(database, args.round)
    return data_dir, settings, database, version, resolve_path(settings, version.base_model_path)


def finish_tool(result: dict, models, json_path: str | None) -> int:
    """A round tool's last step: each model's false positives by finding printed, the result written as JSON."""
    for name in models:
        print_false_positives(name, result[name])
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1, default=str))
    return 0


def round_version(database, round_id: int):
    """The model version round `round_id` made."""
    from db import ModelVersionRepository  # noqa: PLC0415 -- loads sqlalchemy

    return next(v for v in ModelVersionRepository(database).list() if v.round_id == round_id)


def grpo_twin_dir(data_dir: Path, round_id: int) -> Path:
    """Where `bench_round_grpo_twin --round ID` keeps GRPO trained on that round's own rows, recipe and steps."""
    return data_dir / f"grpo-from-round-{round_id}"


def fit_version_verifier(settings, round_id: int, base, adapter, *, add_max_fpr: float | None = None) -> dict:
    """Fit and save the finding verifier of round `round_id`'s version, from the round's own train.csv and recipe
    (`add_max_fpr`: the round setting finding_verifier_add_max_fpr, None the verifier's default; 0 adds nothing)."""
    recipe = json.loads((Path(adapter) / "orapo_recipe.json").read_text())["script"]
    recipe["train_csv"] = str(settings.resolved_data_dir / "rounds" / str(round_id) / "train.csv")
    dataset = load_round_dataset(SimpleNamespace(**recipe))
    loaded = load_model(base, adapter)
    with loaded.using() as model:
        verifier = fit_round_verifier(
            model,
            loaded.processor,
            dataset,
            prompt=recipe.get("prompt_text"),
            add_max_fpr=ADD_MAX_FPR if add_max_fpr is None else float(add_max_fpr),
        )
    if verifier is not None:
        verifier.save(adapter)
    return describe(verifier)


# --- the outcome -----------------------------------------------------------------------------------------------


def outcome(
    model_dir,
    adapter,
    positives,
    negatives,
    finding: str,
    folder: Path,
    *,
    agreement: bool = False,
    checks: bool = True,
    rows: bool = False,
) -> dict:
    """Greedy drafts of the one evaluator on PNGs of the test studies: recall, FPR and macro-F1.

    `checks=False` sets the version's finding checks aside (orapo_core.models.verifier): what the model writes alone.

    With `agreement`, the same drafts are also drawn with the app's 4 samples each, and scored again at each
    operating point of `AGREEMENT`: a finding's sentence kept only where at least that share of the samples
    assert it too (`orapo_core.facts.keep_agreed`), under "agreement". The app's drafts are the one at its
    `ORAPO_DRAFT_MIN_AGREEMENT` (`shown`)."""
    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- tests patch Drafter
    from orapo_core.models.evaluate import evaluate_drafter  # noqa: PLC0415 -- tests patch evaluate_drafter

    records = phantom_test_records(positives, folder, "pos") + phantom_test_records(negatives, folder, "neg")
    drafter = Drafter.from_dir(model_dir, adapter)
    if not checks:
        drafter.verifier = None
    result = evaluate_drafter(drafter, records, samples=4 if agreement else 0)
    out = _rates(result, len(positives), finding)
    if rows:  # each study's labels, as the rounds' gate reads them (`app.services.rounds.worker.prediction_rows`)
        from app.services.rounds.worker import prediction_rows  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

        out["rows"] = prediction_rows(result.predictions, records)
    if agreement:
        out["agreement"] = {
            str(q): _rates(
                rescore(result, records, lambda row, q=q: keep_agreed(row["draft"], row["samples"], q)),
                len(positives),
                finding,
            )
            for q in AGREEMENT
        }
    return out


def shown(scores: dict, min_agreement: float) -> dict:
    """The scores of the drafts the app shows at `min_agreement` (ORAPO_DRAFT_MIN_AGREEMENT; 0: greedy)."""
    return scores["agreement"][str(min_agreement)] if min_agreement else scores


def _rates(result, n_positive: int, finding: str) -> dict:
    label = LABEL[finding]
    said = [r["labels"].get(label) in (1, -1) for r in result.predictions]
    pos = said[:n_positive]
    neg = said[n_positive:]
    return {
        "recall": sum(pos) / len(pos),
        "false_positive_rate": sum(neg) / len(neg),
        **result.metrics.headline(),
        "n_positive": len(pos),
        "n_negative": len(neg),
        **false_positives_by_finding(result.predictions[n_positive:], neg),
    }


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


def print_outcome(name: str, r: dict, finding: str) -> None:
    """One model's outcome (and its operating points of sample agreement, when scored) on the console."""
    print(
        f"{name:10s} recall {r['recall']:.3f} ({r['n_positive']} with {finding}), false-positive rate "
        f"{r['false_positive_rate']:.3f} ({r['n_negative']} without), "
        f"macro-F1(14) {EvalMetrics.from_dict(r).macro_f1_14:.3f}"
    )
    for q, a in (r.get("agreement") or {}).items():
        print(
            f"{'':10s} kept where >= {float(q):.2f} of samples agree: recall {a['recall']:.3f}, "
            f"false-positive rate {a['false_positive_rate']:.3f}, macro-F1(14) {EvalMetrics.from_dict(a).macro_f1_14:.3f}"
        )


def print_false_positives(name: str, r: dict) -> None:
    """One model's recall and false-positive rate, with where the false positives are (the four worst findings)."""
    worst = sorted(r["false_positives_by_finding"].items(), key=lambda kv: -kv[1][0] / kv[1][1])[:4]
    print(
        f"{name:10s} recall {r['recall']:.3f}, false-positive rate {r['false_positive_rate']:.3f} "
        f"(normal films {r['false_positives_on_normal'][0]}/{r['false_positives_on_normal'][1]}; "
        + ", ".join(f"with {k} {a}/{n}" for k, (a, n) in worst)
        + ")"
    )
