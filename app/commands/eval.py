"""Evaluate a model's drafts with the clinical-efficacy metrics of the field.

14- and 5-observation micro/macro precision, recall and F1 (uncertain counted as
positive), per-class F1, mean report length and the mean FactS reward, on a
dataset in any layout `orapo_core.data.load_dataset` reads. Drafts are greedy,
`--batch-size` images per `generate` (the same texts as one by one), with the
findings fewer than `--min-agreement` of 4 samples state left out, as the app
drafts (ORAPO_DRAFT_MIN_AGREEMENT; 0: the greedy drafts as they are), scored by
`orapo_core.models.evaluate.evaluate_drafter`, as the rounds' gate scores them.
Without `--model` or ORAPO_MODEL_DIR the starter is evaluated (copied from
`assets/starter/` into a fresh data folder).
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default ORAPO_MODEL_DIR, else the starter)")
    parser.add_argument("--adapter", default=None, help="a LoRA adapter folder to apply")
    parser.add_argument(
        "--data", required=True, help="a dataset CSV or folder (PhantomCXR, CheXpert Plus, MIMIC-CXR, IU X-ray)"
    )
    parser.add_argument("--split", default=None, help="only records of this split (e.g. test)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many studies")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=8,
        metavar="N",
        help="images drafted per generate call (default 8; the greedy texts do not depend on it)",
    )
    parser.add_argument(
        "--min-agreement",
        type=float,
        default=None,
        metavar="SHARE",
        help="the drafts' operating point (default ORAPO_DRAFT_MIN_AGREEMENT, as the app drafts; 0: greedy)",
    )
    parser.add_argument("--json", dest="json_out", default=None, help="write metrics and predictions to this JSON file")


def run(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415 -- keeps `orapo --help` light

    from orapo_core.data import load_dataset  # noqa: PLC0415 -- loads numpy
    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light
    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- loads numpy
    from orapo_core.models.evaluate import evaluate_drafter  # noqa: PLC0415 -- tests patch evaluate_drafter
    from orapo_core.models.loading import resolve_model_dir  # noqa: PLC0415 -- keeps `orapo --help` light

    if args.batch_size < 1:
        raise OrapoError("eval_invalid", f"--batch-size must be at least 1; got {args.batch_size}.")
    records = load_dataset(args.data)
    if args.split:
        records = [r for r in records if r.split == args.split]
    records = [r for r in records if r.image_paths][: args.limit]
    if not records:
        raise OrapoError("no_studies", "The dataset has no studies with images to evaluate (check --data and --split).")
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    agreement = Settings().draft_min_agreement if args.min_agreement is None else args.min_agreement
    drafter = Drafter.from_dir(resolve_model_dir(args.model), args.adapter, min_agreement=agreement)

    def progress(done: int, total: int) -> None:
        print(f"\r{done}/{total} studies", end="", file=sys.stderr, flush=True)

    result = evaluate_drafter(
        drafter, records, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, progress=progress
    )
    print(file=sys.stderr)
    m = result.metrics
    print(
        f"studies: {m.n_reports}"
        + (f" (findings kept where >= {agreement:g} of 4 samples state them)" if agreement else " (greedy drafts)")
    )
    print(
        f"14 observations: macro P/R/F1 {m.macro_precision_14:.3f}/{m.macro_recall_14:.3f}/{m.macro_f1_14:.3f}"
        f"  micro P/R/F1 {m.micro_precision_14:.3f}/{m.micro_recall_14:.3f}/{m.micro_f1_14:.3f}"
    )
    print(
        f"5 observations: macro P/R/F1 {m.macro_precision_5:.3f}/{m.macro_recall_5:.3f}/{m.macro_f1_5:.3f}"
        f"  micro P/R/F1 {m.micro_precision_5:.3f}/{m.micro_recall_5:.3f}/{m.micro_f1_5:.3f}"
    )
    for name, f1 in m.f1_per_class.items():
        print(f"  {name:28s} F1 {f1:.3f}  (support {m.support_per_class[name]})")
    print(f"mean report length: {m.mean_report_length:.1f} words; mean FactS reward: {m.facts_reward_mean}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result.to_dict(), f, indent=1, default=str)
    return 0
