"""Label radiology reports with the FactS labeler into a CheXpert-style CSV.

Values follow the CheXpert labeler: 1 positive, 0 negative, -1 uncertain, empty
when not mentioned. With `--schema chestxray14` a probable finding ("likely",
"probable", either side of "A versus B") is written 1 and only a possible one
("may", "cannot be excluded") -1, as NegBio's human coders wrote Open-i
(docs/pages/facts.md). Only the standard library and `orapo_core.facts` are
imported, so this command starts without torch.
"""

from __future__ import annotations

import argparse
import csv
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reports", metavar="REPORTS.csv", help="CSV with an `id` column and a report text column")
    parser.add_argument(
        "-o", "--output", metavar="LABELS.csv", required=True, help="where to write the labels ('-' for stdout)"
    )
    parser.add_argument(
        "--schema", choices=("chexpert", "chestxray14"), default="chexpert", help="label space (default: chexpert)"
    )
    parser.add_argument(
        "--text-column", default="report", metavar="NAME", help="column holding the report text (default: report)"
    )
    parser.add_argument("--id-column", default="id", metavar="NAME", help="column holding the report id (default: id)")


def run(args: argparse.Namespace) -> int:
    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light
    from orapo_core.facts import label_report  # noqa: PLC0415 -- keeps `orapo --help` light
    from orapo_core.facts.ontology import schema_labels  # noqa: PLC0415 -- keeps `orapo --help` light

    names = schema_labels(args.schema)
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        source = open(args.reports, newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise OrapoError("reports_unreadable", f"Cannot read {args.reports}: {exc.strerror or exc}.") from None
    with source:
        reader = csv.DictReader(source)
        columns = reader.fieldnames or []
        for needed in (args.id_column, args.text_column):
            if needed not in columns:
                raise OrapoError(
                    "missing_column",
                    f"{args.reports} has no column {needed!r} (columns: {', '.join(columns) or 'none'}); "
                    "name the right one with --id-column or --text-column.",
                )
        out = sys.stdout if args.output == "-" else open(args.output, "w", newline="", encoding="utf-8")
        try:
            writer = csv.writer(out)
            writer.writerow([args.id_column, *names])
            count = 0
            for row in reader:
                labels = label_report(row.get(args.text_column) or "", args.schema)
                writer.writerow([row.get(args.id_column, ""), *("" if labels[n] is None else labels[n] for n in names)])
                count += 1
        finally:
            if out is not sys.stdout:
                out.close()
    if args.output != "-":
        print(f"labelled {count} reports ({args.schema}) -> {args.output}", file=sys.stderr)
    return 0
