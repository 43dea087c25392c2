"""Work with the archive (PACS): find studies (QIDO-RS), pull them in over WADO-RS, or receive them over DIMSE.

`orapo pacs search [--date D] [--modality CR|DX] [--accession A] [--json]` lists
the archive's chest radiograph studies and which are imported already;
`orapo pacs pull STUDY_UID... | --since DATE [--json]` retrieves them and runs
the same ingest as an upload, one line per instance; exit 1 when any instance
was refused. The archive is ORAPO_DICOMWEB_URL (with ORAPO_DICOMWEB_USER and
ORAPO_DICOMWEB_PASSWORD, or ORAPO_DICOMWEB_TOKEN). `orapo pacs listen --port 11112
--ae-title ORAPO [--host H] [--allow-aet A]` receives what modalities push (C-STORE,
C-ECHO) and ingests it the same way, one line per instance, until stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

#: How many studies per modality `pull --since` asks the archive for.
SINCE_LIMIT = 1000


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="pacs_command", metavar="ACTION", required=True)
    search = sub.add_parser("search", help="list the archive's studies (QIDO-RS) and which are imported already")
    search.add_argument("--date", help="study date or range: 2024-05-31, 2024-05-01..2024-05-31, 2024-05-01..")
    search.add_argument(
        "--modality",
        choices=("CR", "DX"),
        action="append",
        help="only studies with this modality (repeatable; default CR and DX)",
    )
    search.add_argument("--accession", help="only the study with this accession number")
    search.add_argument("--limit", type=int, default=200, help="at most this many studies per modality (default 200)")
    search.add_argument("--json", action="store_true", help="print one JSON object per study")
    pull = sub.add_parser("pull", help="retrieve studies (WADO-RS) and ingest them, de-identified, as uploads are")
    pull.add_argument("studies", nargs="*", metavar="STUDY_UID", help="the archive's StudyInstanceUIDs")
    pull.add_argument("--since", help="every CR/DX study from this date on (2024-05-01), instead of named studies")
    pull.add_argument("--json", action="store_true", help="print one JSON object per instance")
    listen = sub.add_parser("listen", help="receive images pushed over DIMSE (C-STORE SCP, C-ECHO) and ingest them")
    listen.add_argument("--port", type=int, default=11112, help="TCP port (default 11112)")
    listen.add_argument("--ae-title", default="ORAPO", help="this node's AE title (default ORAPO)")
    listen.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for modalities on the network)"
    )
    listen.add_argument(
        "--allow-aet",
        action="append",
        default=[],
        metavar="AE_TITLE",
        help="accept only senders with this calling AE title (repeatable; default any)",
    )
    listen.add_argument("--json", action="store_true", help="print one JSON object per instance")


def run(args: argparse.Namespace) -> int:
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.archive.pacs import Archive  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic
    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light

    if args.pacs_command == "listen":
        if not 0 < args.port < 65536:
            raise OrapoError("bad_option", f"--port is a TCP port, 1 to 65535, not {args.port}.")
        settings = Settings()
        return _listen(args, open_database(settings), settings)
    archive = Archive.from_environment()
    settings = Settings()
    database = open_database(settings)
    if args.pacs_command == "search":
        return _search(archive, args, database, settings)
    if bool(args.studies) == bool(args.since):
        raise OrapoError(
            "study_or_since",
            "Name the archive's study UIDs, or give --since DATE: "
            "`orapo pacs pull 1.2.840...` or `orapo pacs pull --since 2024-05-01`.",
        )
    return _pull(archive, args, database, settings)


def _search(archive, args, database, settings) -> int:
    from dataclasses import asdict  # noqa: PLC0415 -- keeps `orapo --help` light

    from app.services.archive.pacs import (  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
        CHEST_MODALITIES,
        mark_imported,
    )

    studies = mark_imported(
        archive.search(
            date=args.date, modalities=args.modality or CHEST_MODALITIES, accession=args.accession, limit=args.limit
        ),
        db=database,
        settings=settings,
    )
    for study in studies:
        if args.json:
            print(json.dumps(asdict(study)), flush=True)
            continue
        imported = f"imported as study {study.imported_study_id}" if study.imported_study_id else "not imported"
        print(
            f"{study.study_uid}  {_day(study.date)}  {'/'.join(study.modalities) or '-':6}  "
            f"{study.accession or '-':16}  {study.instances if study.instances is not None else '?':>3} image(s)  "
            f"{imported}  {study.description}".rstrip(),
            flush=True,
        )
    if not args.json:
        print(f"{len(studies)} study(ies) in {archive.url}")
    return 0


def _pull(archive, args, database, settings) -> int:
    from app.services.archive.pacs import (  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
        CHEST_MODALITIES,
        pull_study,
    )

    if args.since:
        study_uids = []
        for modality in CHEST_MODALITIES:
            found = archive.search(date=f"{args.since}..", modalities=[modality], limit=SINCE_LIMIT)
            study_uids += [s.study_uid for s in found if s.study_uid not in study_uids]
            if len(found) >= SINCE_LIMIT:  # the archive may hold more than one query returns
                print(
                    f"note: the archive listed {len(found)} {modality} studies, the most one query asks for; "
                    "pull again with a later --since for the rest",
                    file=sys.stderr,
                    flush=True,
                )
    else:
        study_uids = list(args.studies)
    accepted = refused = 0
    for study_uid in study_uids:
        for pulled in pull_study(archive, study_uid, db=database, settings=settings):
            outcome = pulled.outcome
            accepted, refused = accepted + outcome.ok, refused + (not outcome.ok)
            if args.json:
                print(
                    json.dumps({"archive_study": study_uid, "instance": pulled.index, **json.loads(outcome.to_json())}),
                    flush=True,
                )
            elif outcome.ok:
                note = " (already stored)" if outcome.duplicate else ""
                print(f"ok      {study_uid} #{pulled.index} -> study {outcome.study_id}{note}", flush=True)
            else:
                print(f"refused {study_uid} #{pulled.index}: {outcome.error}: {outcome.message}", flush=True)
    if not args.json:
        print(
            f"{len(study_uids)} study(ies) pulled from {archive.url}: {accepted} instance(s) ingested, {refused} refused"
        )
    return 1 if refused else 0


def _listen(args, database, settings) -> int:
    import signal  # noqa: PLC0415 -- keeps `orapo --help` light
    import threading  # noqa: PLC0415 -- keeps `orapo --help` light

    from app.services.archive.dimse import start_listener  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings

    def report(received) -> None:
        outcome = received.outcome
        if args.json:
            print(json.dumps({"calling_ae": received.calling_ae, **json.loads(outcome.to_json())}), flush=True)
        elif outcome.ok:
            note = " (already stored)" if outcome.duplicate else ""
            print(f"ok      from {received.calling_ae} -> study {outcome.study_id}{note}", flush=True)
        else:
            print(f"refused from {received.calling_ae}: {outcome.error}: {outcome.message}", flush=True)

    server = start_listener(
        db=database,
        settings=settings,
        port=args.port,
        host=args.host,
        ae_title=args.ae_title,
        allowed_calling=args.allow_aet,
        on_receive=report,
        block=False,
    )
    print(f"listening as {args.ae_title} on {args.host}:{args.port} (C-STORE, C-ECHO); Ctrl-C stops", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # a service manager's stop ends it as Ctrl-C does
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()  # no new associations; those under way get up to 30 s to finish their transfers
        deadline = time.monotonic() + 30
        while server.ae.active_associations and time.monotonic() < deadline:
            time.sleep(0.1)
    print("stopped", flush=True)
    return 0


def _day(date: str) -> str:
    return f"{date[:4]}-{date[4:6]}-{date[6:8]}" if len(date) == 8 else (date or "-         ")
