"""Export preference pairs as Hugging Face datasets for TRL, or reports as FHIR R4 DiagnosticReports or DICOM SR.

`orapo export pairs --format trl-dpo|trl-grpo OUT` writes a `datasets` folder
(`load_from_disk`) with the images embedded; `orapo export fhir STUDY|--all OUT`
writes one FHIR Bundle (DiagnosticReports with their Provenance) per study;
`orapo export sr STUDY|--all OUT [--send]` writes each signed report as a DICOM
Comprehensive SR and, with --send, stores it in the archive (STOW-RS); a study
that cannot be written is skipped with its code, the others are written, and
the exit status is 1 (as for `orapo ingest`).
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="export_command", metavar="WHAT", required=True)
    pairs = sub.add_parser("pairs", help="preference pairs (trl-dpo) or OraPO prompts (trl-grpo) as a datasets folder")
    pairs.add_argument("--format", choices=("trl-dpo", "trl-grpo"), default="trl-dpo")
    pairs.add_argument(
        "--source", choices=("clinician_edit", "oracle_step"), default=None, help="trl-dpo: only pairs of this source"
    )
    pairs.add_argument("--round", type=int, default=None, help="trl-dpo: only the pairs a round used")
    pairs.add_argument("out", help="a new (or empty) folder")
    fhir = sub.add_parser("fhir", help="FHIR R4 DiagnosticReports (+ Provenance) as one Bundle per study")
    fhir.add_argument("study", nargs="?", type=int, default=None, help="a study id (or --all)")
    fhir.add_argument("out", help="the folder to write study-<id>.json files into")
    fhir.add_argument("--all", action="store_true", help="every study with a draft or a report")
    sr = sub.add_parser("sr", help="signed reports as DICOM Comprehensive SR, one file per study")
    sr.add_argument("study", nargs="?", type=int, default=None, help="a study id (or --all)")
    sr.add_argument("out", help="the folder to write study-<id>.dcm files into")
    sr.add_argument("--all", action="store_true", help="every study with a signed report")
    sr.add_argument(
        "--send", action="store_true", help="also store each SR in the archive ORAPO_DICOMWEB_URL names (STOW-RS)"
    )


def run(args: argparse.Namespace) -> int:
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic
    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light

    settings = Settings()
    database = open_database(settings)
    if args.export_command == "pairs":
        from app.services.operations.export import export_pairs  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

        print(export_pairs(database, settings, args.out, format=args.format, source=args.source, round_id=args.round))
        return 0
    what = args.export_command
    if (args.study is None) == (not args.all):
        raise OrapoError(
            "study_or_all",
            f"Name one study id, or give --all: `orapo export {what} 12 OUT` or `orapo export {what} --all OUT`.",
        )
    study_ids = None if args.all else [args.study]
    if what == "sr":
        from app.services.archive.export_sr import export_sr  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

        archive = None
        if args.send:  # before anything is written: a missing archive setting is known now
            from app.services.archive.pacs import Archive  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

            archive = Archive.from_environment()
        result = export_sr(database, settings, args.out, study_ids=study_ids, archive=archive)
        print(result)
        # As `orapo ingest`: 1 when some signed report was not written (skipped) or did not reach the archive.
        return 1 if result.skipped or result.unsent else 0
    from app.services.operations.export_fhir import export_fhir  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    print(export_fhir(database, args.out, study_ids=study_ids))  # with what was skipped, and why
    return 0
