"""Reports as FHIR R4 DiagnosticReports (`orapo export fhir`), one collection Bundle per study.

`fhir.resources` 8.x puts R5 at the top level and ships R4B
(`fhir.resources.R4B`), not R4. R4B is the R4 maintenance release whose
DiagnosticReport, Provenance and Bundle are unchanged from R4, so validating
against R4B validates the R4 wire format receivers expect; R5 differs
(e.g. DiagnosticReport.note, Provenance changes) and would not.

A sentence the version's automatic finding check added to a draft (`DraftRecord.added`: read on the image, not
written by the model; `orapo_core.models.verifier`) stays marked: R4's DiagnosticReport has no note, so each is an
extension of the report (`ADDED_BY_CHECK`, the sentence as its valueString) on the draft, and on the signed report
where the reader kept it (`kept_additions`); the draft's Provenance also names the check as an author of it.
A study that cannot be exported is skipped with its reason (`app.services.operations.export.build_each`).
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.operations.export import SkippedStudy, build_each
from db import DraftRepository, ModelVersionRepository, StudyRepository, UserRepository
from orapo_core.errors import OrapoError
from orapo_core.report_layout import normalize_space, split_report

if TYPE_CHECKING:
    from db import Database
    from db.records import DraftRecord, StudyRecord

LOINC = "http://loinc.org"
REPORT_CODE = {"system": LOINC, "code": "18748-4", "display": "Diagnostic imaging study"}
RADIOLOGY = {"system": "http://terminology.hl7.org/CodeSystem/v2-0074", "code": "RAD", "display": "Radiology"}
PARTICIPANT = "http://terminology.hl7.org/CodeSystem/provenance-participant-type"
UUID_NAMESPACE = uuid.UUID("8b9d2f5e-4a0c-4f63-9d55-0f7a1c2e6b01")
#: The extension naming a sentence of a report that the finding check added to the model's draft.
ADDED_BY_CHECK = "urn:orapo:fhir:extension:sentence-added-by-automatic-finding-check"


def _urn(*parts: Any) -> str:
    return f"urn:uuid:{uuid.uuid5(UUID_NAMESPACE, '/'.join(map(str, parts)))}"


def _instant(value: datetime) -> str:
    return value.isoformat()


def kept_additions(draft: Any, text: str | None) -> list[str]:
    """The sentences the finding check added to `draft` (a DraftRecord, or None) that `text` still says, word for
    word (whitespace aside): in a signed report, those the reader kept."""
    said = normalize_space(text)
    return [s for s in (draft.added if draft is not None else []) if normalize_space(s) and normalize_space(s) in said]


def _diagnostic_report(
    study: StudyRecord,
    text: str,
    *,
    status: str,
    issued: datetime,
    performer: str | None,
    identifier: str,
    added: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    _, impression = split_report(text)
    report: dict[str, Any] = {
        "resourceType": "DiagnosticReport",
        **({"extension": [{"url": ADDED_BY_CHECK, "valueString": s} for s in added]} if added else {}),
        "identifier": [{"system": "urn:orapo:report", "value": identifier}],
        "status": status,
        "category": [{"coding": [RADIOLOGY]}],
        "code": {"coding": [REPORT_CODE], "text": "Chest X-ray report"},
        "subject": {
            "identifier": {"system": "urn:orapo:patient-pseudonym", "value": study.patient_pseudonym},
            "display": study.patient_pseudonym,
        },
        "effectiveDateTime": _instant(study.created_at),
        "issued": _instant(issued),
        "presentedForm": [
            {
                "contentType": "text/plain; charset=utf-8",
                "language": "en",
                "data": base64.b64encode(text.encode("utf-8")).decode("ascii"),
                "title": "Chest X-ray report",
                "creation": _instant(issued),
            }
        ],
    }
    if impression:
        report["conclusion"] = impression
    if performer:
        report["resultsInterpreter" if status == "final" else "performer"] = [{"display": performer}]
    return report


def _provenance(
    target: str, recorded: datetime, agents: list[tuple[str, str]], entity: str | None = None
) -> dict[str, Any]:
    prov: dict[str, Any] = {
        "resourceType": "Provenance",
        "target": [{"reference": target}],
        "recorded": _instant(recorded),
        "agent": [
            {"type": {"coding": [{"system": PARTICIPANT, "code": role}]}, "who": {"display": who}}
            for role, who in agents
        ],
    }
    if entity:
        prov["entity"] = [{"role": "source", "what": {"reference": entity}}]
    return prov


def _model_label(versions: ModelVersionRepository, draft: DraftRecord) -> str:
    if draft.model_version_id is not None:
        try:
            v = versions.get(draft.model_version_id)
            return f"OraPO model version {v.id} ({v.name})"
        except OrapoError:
            pass
    return f"OraPO model {draft.model_name}"


def fhir_bundle(db: Database, study_id: int) -> dict[str, Any]:
    """A FHIR R4 `collection` Bundle of a study's reports: the latest model draft (preliminary) and the signed report
    (final), each with a Provenance naming the model version that drafted it; validated before it is returned."""
    from fhir.resources.R4B.bundle import Bundle

    overview = StudyRepository(db).overview(study_id)
    study = overview.study
    versions = ModelVersionRepository(db)
    entries: list[dict[str, Any]] = []
    draft = overview.latest_draft
    correction = overview.latest_correction
    signed = correction if correction is not None and correction.signed_at is not None else None
    if signed is not None and signed.draft_id is not None:
        draft = DraftRepository(db).get(signed.draft_id)  # the draft the signed report was made from
    draft_url = None
    if draft is not None:
        draft_url = _urn("draft", study.study_uid_hash, draft.id)
        model = _model_label(versions, draft)
        entries.append(
            {
                "fullUrl": draft_url,
                "resource": _diagnostic_report(
                    study,
                    draft.text,
                    status="preliminary",
                    issued=draft.created_at,
                    performer=model,
                    identifier=f"draft-{draft.id}",
                    added=draft.added,
                ),
            }
        )
        check = (
            [
                (
                    "author",
                    f"Automatic finding check of {model}: {len(draft.added)} sentence(s) read on the image, "
                    "not written by the model",
                )
            ]
            if draft.added
            else []
        )
        entries.append(
            {
                "fullUrl": _urn("provenance", draft_url),
                "resource": _provenance(draft_url, draft.created_at, [("author", model), *check]),
            }
        )
    if signed is not None:
        assert signed.signed_at is not None  # `signed` is the correction only once it is signed
        author = UserRepository(db).get(signed.author_id).username
        final_url = _urn("final", study.study_uid_hash, signed.id)
        agents = [("author", f"Radiologist {author}"), ("verifier", f"Radiologist {author}")]
        if draft is not None:
            agents.append(("assembler", _model_label(versions, draft)))
        entries.append(
            {
                "fullUrl": final_url,
                "resource": _diagnostic_report(
                    study,
                    signed.text,
                    status="final",
                    issued=signed.signed_at,
                    performer=f"Radiologist {author}",
                    identifier=f"report-{signed.id}-v{signed.version}",
                    added=kept_additions(draft, signed.text),
                ),
            }
        )
        entries.append(
            {
                "fullUrl": _urn("provenance", final_url),
                "resource": _provenance(final_url, signed.signed_at, agents, entity=draft_url),
            }
        )
    if not entries:
        raise OrapoError("no_reports", f"Study {study_id} has no draft or signed report to export.")
    bundle = {
        "resourceType": "Bundle",
        "type": "collection",
        "identifier": {"system": "urn:orapo:study", "value": study.study_uid_hash},
        "entry": entries,
    }
    try:
        return json.loads(Bundle.model_validate(bundle).model_dump_json(exclude_none=True))
    except ValueError as exc:  # pydantic's ValidationError: our bug, said plainly
        raise OrapoError("fhir_invalid", f"The FHIR export of study {study_id} did not validate: {exc}") from exc


@dataclass(frozen=True)
class FhirExport:
    """What `export_fhir` wrote, and the studies it could not export (each with its reason)."""

    out: Path
    written: tuple[Path, ...]
    skipped: tuple[SkippedStudy, ...] = ()

    def __str__(self) -> str:
        text = f"{len(self.written)} FHIR bundle(s) written to {self.out}"
        if self.skipped:
            text += f"; {len(self.skipped)} study(ies) skipped:" + "".join(
                f"\n  study {s.study_id}: {s.error}: {s.message}" for s in self.skipped
            )
        return text


def export_fhir(db: Database, out: str | Path, *, study_ids: list[int] | None = None) -> FhirExport:
    """One `study-<id>.json` Bundle per study (all studies with a draft or a report when `study_ids` is None).

    A study that cannot be exported (say, an unsigned report and no draft) is skipped, with its reason, and
    the others are still written; the skipped ones are listed in `skipped.json` next to the bundles. Only when
    nothing at all could be written is that an error (the single study's own, when one was asked for)."""
    out = Path(out)
    if study_ids is None:
        study_ids = [
            o.study.id
            for o in reversed(StudyRepository(db).list(limit=1_000_000))
            if o.latest_draft is not None or o.latest_correction is not None
        ]
        if not study_ids:
            raise OrapoError("nothing_to_export", "There are no studies with a draft or a report to export yet.")
    bundles: list[tuple[int, dict[str, Any]]]
    bundles, skipped = build_each(study_ids, lambda study_id: (study_id, fhir_bundle(db, study_id)))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for study_id, bundle in bundles:
        path = out / f"study-{study_id}.json"
        path.write_text(json.dumps(bundle, indent=1))
        written.append(path)
    if skipped:
        (out / "skipped.json").write_text(json.dumps([asdict(s) for s in skipped], indent=1))
    return FhirExport(out, tuple(written), tuple(skipped))
