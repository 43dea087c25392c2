"""A signed report as a DICOM Comprehensive SR (TID 2000, Basic Diagnostic Imaging Report), built with highdicom.

What a PACS shows is a text report; what an SR adds is structure: FINDINGS and
IMPRESSION are TEXT items in the template's Findings (121070) and Impressions
(121072) containers, every FactS fact of the signed text that has a code is a
CODE item "Finding" (121071) with its presence (Present / Absent / Presence
Undetermined for the labeler's positive / negative / uncertain) and laterality,
and the observation context (TID 1001) names both observers: the signing reader
(a person, also the verifying observer) and the model version that drafted
(a device). A sentence of the signed text that the version's automatic finding
check added to the model's draft (read on the image, not written by the model;
`orapo_core.models.verifier`) is named in a TEXT "Comment" (121106) of the
Findings container (`ADDED_NOTE`), one per sentence, so a reader of the SR sees
which words neither the model nor the reader wrote first. Each finding, and the
narrative, is inferred from the de-identified image, referenced by its SOP instance; the SR's patient and study attributes are
copied from that image by highdicom, so it carries the same pseudonyms and UIDs
and no more.

Codes (`FINDING_CODES`): where DICOM PS3.16 has the concept, the code is taken
from pydicom's code dictionary (`pydicom.sr.codedict.codes`, generated from
PS3.16's context groups; highdicom uses the same dictionary), most from CID 6102
"Chest Finding or Feature Modifier" of the Chest CAD SR. Five common findings
have no PS3.16 code; they use the SNOMED CT concepts every clinical system uses
for them (Atelectasis 46621007, Lung consolidation 95436008, Pneumonia
233604007, Fracture of bone 125605004, Pulmonary emphysema 87433001). Enlarged
cardiomediastinum, pleural abnormalities other than effusion, hernia and
unnamed devices have no single code and stay in the text only.

Dates: the SR's content, series and verification dates are the de-identified
study's (shifted) date, never the real date of signing, which would tell the
per-patient shift to anyone holding both; the real time stays in the database.
An image converted from PNG/JPEG has no date to shift, and there the date of
signing is used. An SR about the archive's own images (their headers given, with
the real identity, `dated_by_signing`) is dated by its signing (UTC, with the
offset stated): the archive knows the real dates already, and that SR is only
ever sent to it (`app.services.archive.export_sr.archive_sr`).

The built SR is written to bytes and read back with pydicom and highdicom before
it is returned; a document that does not read back as it was meant is an error
(`sr_invalid`), never a file.
"""

from __future__ import annotations

import datetime as dt
import functools
import io
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from orapo_core.errors import OrapoError
from orapo_core.facts import extract_facts
from orapo_core.report_layout import split_report

if TYPE_CHECKING:
    from highdicom.sr import CodedConcept, ContentItem, ImageContentItem
    from pydicom.dataset import Dataset
    from pydicom.sr.coding import Code

_Item = TypeVar("_Item", bound="ContentItem")

SERIES_NUMBER = 900  # reports after the images, as modalities number their derived series
MANUFACTURER = "OraPO"
PRESENCE = {"positive": "present", "negative": "absent", "uncertain": "undetermined"}
_UID_NAMESPACE = uuid.UUID("5f0e7a52-93c4-4d1e-8a3b-2c6d0f9e41a7")
_RANK = {"absent": 1, "undetermined": 2, "present": 3}
#: The Comment a sentence the finding check added (and the reader kept) is named in, the sentence after the colon.
ADDED_NOTE = (
    "Added to the model's draft by an automatic finding check (read on the image, not written by the "
    "model); kept by the signing reader: "
)  # the labeler's aggregation: a positive anywhere wins

# FactS concept -> (scheme, code value, meaning, source). Devices are coded by their kind (`_DEVICE_CODES`).
_PS316 = "DICOM PS3.16 via pydicom.sr.codedict"
_SNOMED = "SNOMED CT (no PS3.16 code)"
FINDING_CODES: dict[str, tuple[str, str, str, str]] = {
    "Cardiomegaly": ("SCT", "287272002", "Cardiomegaly", _PS316),
    "Lung Opacity": ("DCM", "112001", "Opacity", _PS316),
    "Lung Lesion": ("SCT", "52988006", "Lesion", _PS316),
    "Edema": ("SCT", "19242006", "Pulmonary edema", _PS316),
    "Consolidation": ("SCT", "95436008", "Lung consolidation", _SNOMED),
    "Pneumonia": ("SCT", "233604007", "Pneumonia", _SNOMED),
    "Atelectasis": ("SCT", "46621007", "Atelectasis", _SNOMED),
    "Pneumothorax": ("SCT", "36118008", "Pneumothorax", _PS316),
    "Pleural Effusion": ("SCT", "60046008", "Pleural effusion", _PS316),
    "Fracture": ("SCT", "125605004", "Fracture of bone", _SNOMED),
    "Nodule": ("SCT", "27925004", "Nodule", _PS316),
    "Mass": ("SCT", "4147007", "Mass", _PS316),
    "Infiltration": ("DCM", "112121", "Infiltrate", _PS316),
    "Emphysema": ("SCT", "87433001", "Pulmonary emphysema", _SNOMED),
    "Fibrosis": ("SCT", "112674009", "Fibrosis", _PS316),
}
# FactS device kind (orapo_core.facts.vocabulary.DEVICE_TYPES) -> code, all from PS3.16 via pydicom.
_DEVICE_CODES: dict[str, tuple[str, str, str]] = {
    "endotracheal tube": ("SCT", "26412008", "Endotracheal tube"),
    "enteric tube": ("SCT", "25062003", "Feeding tube"),
    "chest tube": ("DCM", "112173", "Chest tube"),
    "central line": ("DCM", "112174", "Central line"),
    "pacemaker": ("SCT", "14106009", "Cardiac pacemaker"),
    "stent": ("SCT", "65818007", "Stent"),
    "valve prosthesis": ("SCT", "25510005", "Heart valve prosthesis"),
}
_LATERALITY = {
    "left": ("SCT", "7771000", "Left"),
    "right": ("SCT", "24028007", "Right"),
    "bilateral": ("SCT", "51440002", "Bilateral"),
}


@dataclass(frozen=True)
class CodedFinding:
    """One coded entry of the SR: the FactS concept, its code, and what the report says of it."""

    concept: str
    scheme: str
    value: str
    meaning: str
    presence: str  # present | absent | undetermined
    laterality: str | None = None


@dataclass(frozen=True)
class ReportSR:
    """What a report SR says, as read back from its bytes."""

    sop_instance_uid: str
    study_instance_uid: str
    findings: str
    impression: str
    coded: tuple[CodedFinding, ...]
    reader: str
    device: str
    referenced_instances: tuple[str, ...]
    verified: bool
    final: bool
    added: tuple[str, ...] = ()  # sentences named as added by the finding check (`ADDED_NOTE`)


def coded_findings(text: str) -> list[CodedFinding]:
    """The facts of a report that have a code, one entry per concept (per device kind), in order of first mention.

    Presence aggregates as the labeler does (present over undetermined over absent); laterality is kept only when
    every mention that decided the presence agrees on it."""
    found: dict[tuple[str, str, str], CodedFinding] = {}
    for fact in extract_facts(text).facts:
        if fact.observation == "Support Devices":
            coded = _DEVICE_CODES.get(fact.attributes.get("device", ""))
        else:
            known = FINDING_CODES.get(fact.observation)
            coded = known[:3] if known is not None else None
        if not coded:
            continue
        scheme, value, meaning = coded
        presence = PRESENCE[fact.polarity]
        side = fact.attributes.get("laterality")
        entry = CodedFinding(fact.observation, scheme, value, meaning, presence, side)
        key = (scheme, value, fact.observation)
        old = found.get(key)
        if old is None or _RANK[presence] > _RANK[old.presence]:
            found[key] = entry
        elif _RANK[presence] == _RANK[old.presence] and old.laterality != side:
            found[key] = CodedFinding(
                old.concept,
                scheme,
                value,
                meaning,
                presence,
                old.laterality if side is None else (side if old.laterality is None else None),
            )
    return list(found.values())


@functools.cache
def _hd() -> ModuleType:
    import highdicom

    return highdicom


def _code(scheme: str, value: str, meaning: str) -> CodedConcept:
    return _hd().sr.CodedConcept(value=value, scheme_designator=scheme, meaning=meaning)


def _codes() -> Any:
    from pydicom.sr.codedict import codes

    return codes


def build_report_sr(
    images: Iterable[Dataset],
    *,
    report: str,
    reader: str,
    model: str | None,
    organization: str,
    report_key: Iterable[object],
    signed_at: dt.datetime,
    software_version: str = "",
    dated_by_signing: bool = False,
    added: Iterable[str] = (),
) -> bytes:
    """The Comprehensive SR of a signed report about `images` (the study's de-identified pydicom Datasets, the
    first one's patient and study attributes copied), as DICOM bytes.

    `report_key` (say, the study's hashed UID, the report's id and version) makes the SR's UIDs: the same signed
    report always becomes the same SOP instance, so sending it twice stores it once. Read back before it returns.
    `dated_by_signing`: the content and verification dates are the signing time, for an SR about the archive's own
    images (`images` their headers, with the real identity and dates); otherwise the de-identified study's date.
    `added`: the sentences of `report` the finding check added to the model's draft, each named in a Comment.
    """
    hd, codes = _hd(), _codes()
    RT = hd.sr.RelationshipTypeValues
    findings, impression = split_report(report)
    reader_name = person_name(reader)
    if not findings and not impression:
        raise OrapoError("sr_invalid", "The signed report is empty; there is nothing to put in a structured report.")
    evidence = [_evidence(image) for image in images]
    if not evidence:
        raise OrapoError("sr_invalid", "A structured report needs the study's image to refer to.")
    first = evidence[0]
    if any(e.StudyInstanceUID != first.StudyInstanceUID for e in evidence):
        raise OrapoError("sr_invalid", "The images of one report belong to different studies.")
    key = [str(part) for part in report_key]
    added = tuple(dict.fromkeys(" ".join(str(a).split()) for a in added if str(a).strip()))

    def image_refs() -> list[ImageContentItem]:
        return [
            hd.sr.ImageContentItem(
                name=codes.DCM.BestIllustrationOfFinding,
                referenced_sop_class_uid=e.SOPClassUID,
                referenced_sop_instance_uid=e.SOPInstanceUID,
                relationship_type=RT.INFERRED_FROM,
            )
            for e in evidence
        ]

    root = hd.sr.ContainerContentItem(
        name=codes.LN.DiagnosticImagingReport, template_id="2000", is_content_continuous=False
    )
    root.ContentSequence = hd.sr.ContentSequence()
    root.ContentSequence.extend(
        hd.sr.LanguageOfContentItemAndDescendants(_code("RFC5646", "en-US", "English (United States)"))
    )
    person = hd.sr.ObserverContext(
        observer_type=codes.DCM.Person,
        observer_identifying_attributes=hd.sr.PersonObserverIdentifyingAttributes(
            name=reader_name, organization_name=organization, role_in_organization=codes.DCM.Physician
        ),
    )
    device = None
    if model:
        device = hd.sr.ObserverContext(
            observer_type=codes.DCM.Device,
            observer_identifying_attributes=hd.sr.DeviceObserverIdentifyingAttributes(
                uid=_uid("orapo-model", model), name=model[:64], manufacturer_name=MANUFACTURER, model_name=model[:64]
            ),
        )
    root.ContentSequence.extend(
        hd.sr.ObservationContext(observer_person_context=person, observer_device_context=device)
    )

    section = hd.sr.ContainerContentItem(name=codes.DCM.Findings, relationship_type=RT.CONTAINS)
    section.ContentSequence = hd.sr.ContentSequence()
    if findings:
        section.ContentSequence.append(
            _with_children(
                hd.sr.TextContentItem(name=codes.DCM.Finding, value=findings, relationship_type=RT.CONTAINS),
                image_refs(),
            )
        )
    for finding in coded_findings(report):
        children = []  # the concept modifier first: it qualifies the concept the other children are about
        if finding.laterality in _LATERALITY:
            children.append(
                hd.sr.CodeContentItem(
                    name=codes.SCT.Laterality,
                    value=_code(*_LATERALITY[finding.laterality]),
                    relationship_type=RT.HAS_CONCEPT_MOD,
                )
            )
        children.append(
            hd.sr.CodeContentItem(
                name=codes.DCM.PresenceOfProperty,
                value=_presence_code(finding.presence),
                relationship_type=RT.HAS_PROPERTIES,
            )
        )
        children.extend(image_refs())
        section.ContentSequence.append(
            _with_children(
                hd.sr.CodeContentItem(
                    name=codes.DCM.Finding,
                    value=_code(finding.scheme, finding.value, finding.meaning),
                    relationship_type=RT.CONTAINS,
                ),
                children,
            )
        )
    for sentence in added:
        section.ContentSequence.append(
            hd.sr.TextContentItem(name=codes.DCM.Comment, value=ADDED_NOTE + sentence, relationship_type=RT.CONTAINS)
        )
    root.ContentSequence.append(section)
    conclusions = hd.sr.ContainerContentItem(name=codes.DCM.Impressions, relationship_type=RT.CONTAINS)
    conclusions.ContentSequence = hd.sr.ContentSequence()
    if impression:
        conclusions.ContentSequence.append(
            hd.sr.TextContentItem(name=codes.DCM.Impression, value=impression, relationship_type=RT.CONTAINS)
        )
    root.ContentSequence.append(conclusions)

    day, time = (
        (signed_at.strftime("%Y%m%d"), signed_at.strftime("%H%M%S"))
        if dated_by_signing
        else _report_date(first, signed_at)
    )
    sr = hd.sr.ComprehensiveSR(
        evidence=evidence,
        content=root,
        series_instance_uid=_uid("orapo-sr-series", first.StudyInstanceUID),
        series_number=SERIES_NUMBER,
        sop_instance_uid=_uid("orapo-sr", *key),
        instance_number=1,
        manufacturer=MANUFACTURER,
        is_complete=True,
        is_final=True,
        is_verified=True,
        verifying_observer_name=reader_name,
        verifying_organization=organization,
        series_description="Signed report (OraPO)",
        content_date=day,
        content_time=time,
        series_date=day,
        series_time=time,
        specific_character_set="ISO_IR 192",
        **({"software_versions": software_version} if software_version else {}),
    )
    sr.InstanceCreationDate, sr.InstanceCreationTime = day, time
    utc_offset = signed_at.utcoffset() if dated_by_signing else None
    if utc_offset is not None:  # the signing time as stored: UTC
        offset = int(utc_offset.total_seconds() // 60)
        sr.TimezoneOffsetFromUTC = f"{'+' if offset >= 0 else '-'}{abs(offset) // 60:02d}{abs(offset) % 60:02d}"
    sr.VerifyingObserverSequence[0].VerificationDateTime = day + time
    for keyword in (
        "PatientIdentityRemoved",
        "DeidentificationMethod",
        "DeidentificationMethodCodeSequence",
        "LongitudinalTemporalInformationModified",
    ):
        if keyword in first:
            setattr(sr, keyword, first[keyword].value)
    buffer = io.BytesIO()
    sr.save_as(buffer, enforce_file_format=True)
    data = buffer.getvalue()
    back = read_report_sr(data)
    meant = [(c.scheme, c.value, c.presence, c.laterality) for c in coded_findings(report)]
    if (
        (back.findings, back.impression, back.reader) != (findings, impression, reader_name.rstrip("^"))
        or [(c.scheme, c.value, c.presence, c.laterality) for c in back.coded] != meant
        or set(back.referenced_instances) != {e.SOPInstanceUID for e in evidence}
        or back.added != added
    ):
        raise OrapoError("sr_invalid", "The structured report did not read back as it was written; nothing was kept.")
    return data


def _uid(*parts: object) -> str:
    """A UID under 2.25 derived from `parts` (a name-based UUID, PS3.5 B.2): the same parts, the same UID."""
    return f"2.25.{uuid.uuid5(_UID_NAMESPACE, '/'.join(map(str, parts))).int}"


def person_name(name: str) -> str:
    """A user name as a DICOM person name: the family-name component (a trailing caret says it is one on purpose)."""
    name = " ".join(str(name).split()).replace("\\", " ")
    return name if "^" in name else f"{name}^"


def _with_children(item: _Item, children: Sequence[ContentItem]) -> _Item:
    item.ContentSequence = _hd().sr.ContentSequence(children)
    return item


def _presence_code(presence: str) -> Code:
    codes = _codes().DCM
    return {"present": codes.Present, "absent": codes.Absent, "undetermined": codes.PresenceUndetermined}[presence]


def _evidence(image: object) -> Dataset:
    """The image as highdicom's evidence: every Type 2 patient and study attribute it copies present (a PNG's
    secondary capture has none), nothing else changed."""
    from pydicom.dataset import Dataset

    if not isinstance(image, Dataset) or "SOPInstanceUID" not in image or "StudyInstanceUID" not in image:
        raise OrapoError("sr_invalid", "The study's stored image is not a DICOM instance with UIDs to refer to.")
    evidence = Dataset()
    evidence.update(image)
    evidence.pop("PixelData", None)
    for keyword in (
        "PatientName",
        "PatientID",
        "PatientBirthDate",
        "PatientSex",
        "AccessionNumber",
        "StudyID",
        "StudyDate",
        "StudyTime",
        "ReferringPhysicianName",
    ):
        if keyword not in evidence:
            setattr(evidence, keyword, "")
    return evidence


def _report_date(evidence: Dataset, signed_at: dt.datetime) -> tuple[str, str]:
    day = str(evidence.get("StudyDate") or "")
    if len(day) == 8 and day.isdigit():
        time = str(evidence.get("StudyTime") or "000000").split(".")[0][:6].ljust(6, "0")
        return day, time
    return signed_at.strftime("%Y%m%d"), signed_at.strftime("%H%M%S")


def read_report_sr(data: bytes) -> ReportSR:
    """Read a report SR back with pydicom and highdicom: its texts, coded findings, observers and references."""
    import pydicom
    from pydicom.uid import ComprehensiveSRStorage

    hd = _hd()
    try:
        ds = pydicom.dcmread(io.BytesIO(data))
        sr = hd.sr.ComprehensiveSR.from_dataset(ds)
    except Exception as exc:  # pydicom's and highdicom's own errors: a document that does not parse
        raise OrapoError("sr_invalid", f"The structured report could not be read back ({exc}).") from exc
    if sr.SOPClassUID != ComprehensiveSRStorage:
        raise OrapoError("sr_invalid", f"The document is not a Comprehensive SR ({sr.SOPClassUID}).")
    texts: dict[str, str] = {}
    coded: list[CodedFinding] = []
    reader = device = ""
    referenced: set[str] = set()
    added: list[str] = []
    for item in _walk(ds.ContentSequence):
        name = item.ConceptNameCodeSequence[0].CodeValue if "ConceptNameCodeSequence" in item else ""
        if item.ValueType == "TEXT" and name in ("121071", "121073"):
            texts[name] = str(item.TextValue)
        elif item.ValueType == "TEXT" and name == "121106" and str(item.TextValue).startswith(ADDED_NOTE):
            added.append(str(item.TextValue)[len(ADDED_NOTE) :])
        elif item.ValueType == "PNAME" and name == "121008":  # Person Observer Name
            reader = str(item.PersonName).rstrip("^")
        elif item.ValueType == "TEXT" and name == "121013":  # Device Observer Name
            device = str(item.TextValue)
        elif item.ValueType == "IMAGE":
            referenced.update(str(ref.ReferencedSOPInstanceUID) for ref in item.ReferencedSOPSequence)
        elif item.ValueType == "CODE" and name == "121071":
            value = item.ConceptCodeSequence[0]
            presence, side = "present", None
            for child in item.get("ContentSequence", []):
                child_name = child.ConceptNameCodeSequence[0].CodeValue
                if child.ValueType == "CODE" and child_name == "121052":
                    presence = {"121053": "present", "121054": "absent"}.get(
                        child.ConceptCodeSequence[0].CodeValue, "undetermined"
                    )
                elif child.ValueType == "CODE" and child_name == "272741003":
                    side = str(child.ConceptCodeSequence[0].CodeMeaning).lower()
            coded.append(
                CodedFinding(
                    _concept_of(str(value.CodingSchemeDesignator), str(value.CodeValue)),
                    str(value.CodingSchemeDesignator),
                    str(value.CodeValue),
                    str(value.CodeMeaning),
                    presence,
                    side,
                )
            )
    return ReportSR(
        sop_instance_uid=str(sr.SOPInstanceUID),
        study_instance_uid=str(sr.StudyInstanceUID),
        findings=texts.get("121071", ""),
        impression=texts.get("121073", ""),
        coded=tuple(coded),
        reader=reader,
        device=device,
        referenced_instances=tuple(sorted(referenced)),
        verified=sr.get("VerificationFlag") == "VERIFIED",
        final=sr.get("PreliminaryFlag") == "FINAL",
        added=tuple(added),
    )


def _walk(sequence: Iterable[Dataset]) -> Iterator[Dataset]:
    for item in sequence:
        yield item
        if "ContentSequence" in item:
            yield from _walk(item.ContentSequence)


def _concept_of(scheme: str, value: str) -> str:
    for concept, (s, v, _, _) in FINDING_CODES.items():
        if (s, v) == (scheme, value):
            return concept
    return "Support Devices" if any((s, v) == (scheme, value) for s, v, _ in _DEVICE_CODES.values()) else ""
