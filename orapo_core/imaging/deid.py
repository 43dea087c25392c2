"""De-identification of a DICOM header at ingest (DICOM PS3.15 Annex E).

The Basic Application Level Confidentiality Profile, with the options
"Retain Longitudinal Temporal Information with Modified Dates" (every date of
a patient moves by one offset, so intervals between studies survive) and
"Retain Patient Characteristics" (sex, age, size and weight matter to a chest
report). Beyond the profile's list of named attributes, four safety nets catch
what a vendor put where the list does not look: every person name is emptied,
every free-text (LT/ST/UT) and AE value is removed, every non-standard UID is
replaced, and private, overlay and unknown-VR elements are dropped, at every
depth of every sequence. Pseudonyms, date offsets and UIDs are keyed HMACs of
a secret, so they are stable across uploads and useless without the secret.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import hmac
import uuid

from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom._uid_dict import UID_dictionary

# Attributes of PS3.15 Table E.1-1 that a radiograph can carry, removed
# (action X) unless listed in _EMPTIED (action Z: kept, empty, for type 2).
_REMOVED = frozenset("""
    OtherPatientIDs OtherPatientIDsSequence OtherPatientNames PatientBirthName PatientMotherBirthName
    PatientAddress PatientTelephoneNumbers PatientTelecomInformation PatientBirthTime MedicalRecordLocator
    MilitaryRank BranchOfService Occupation PatientComments AdditionalPatientHistory PatientInsurancePlanCodeSequence
    PatientPrimaryLanguageCodeSequence PatientReligiousPreference EthnicGroup RegionOfResidence CountryOfResidence
    CurrentPatientLocation PatientInstitutionResidence ResponsibleOrganization ResponsiblePerson IssuerOfPatientID
    IssuerOfPatientIDQualifiersSequence MedicalAlerts Allergies LastMenstrualDate SpecialNeeds PatientState
    IssuerOfAccessionNumberSequence StudyDescription SeriesDescription ReferringPhysicianAddress
    ReferringPhysicianTelephoneNumbers ReferringPhysicianIdentificationSequence PhysiciansOfRecord
    PhysiciansOfRecordIdentificationSequence NameOfPhysiciansReadingStudy PhysiciansReadingStudyIdentificationSequence
    RequestingPhysician RequestingPhysicianIdentificationSequence RequestingService RequestedProcedureDescription
    RequestedProcedureID ReasonForStudy ReasonForTheRequestedProcedure RequestAttributesSequence
    AdmittingDiagnosesDescription AdmittingDiagnosesCodeSequence AdmissionID IssuerOfAdmissionIDSequence
    ServiceEpisodeID ServiceEpisodeDescription VisitComments StudyComments ReferencedPatientSequence
    ReferencedStudySequence ReferencedPerformedProcedureStepSequence ConsultingPhysicianName
    InstitutionName InstitutionAddress InstitutionalDepartmentName InstitutionCodeSequence
    InstitutionalDepartmentTypeCodeSequence StationName DeviceSerialNumber DeviceUID PlateID DetectorID GantryID
    CassetteID ProtocolName PerformingPhysicianName PerformingPhysicianIdentificationSequence OperatorsName
    OperatorIdentificationSequence PerformedProcedureStepDescription PerformedProcedureStepID PerformedStationAETitle
    PerformedStationName PerformedLocation ScheduledProcedureStepDescription ScheduledProcedureStepID
    ScheduledPerformingPhysicianName ScheduledStationName ScheduledStationAETitle ScheduledProcedureStepLocation
    CommentsOnThePerformedProcedureStep AcquisitionComments ImageComments DerivationDescription FrameComments
    ContentCreatorName DigitalSignaturesSequence OriginalAttributesSequence ContributingEquipmentSequence
    OrderEnteredBy OrderEntererLocation OrderCallbackPhoneNumber PlacerOrderNumberImagingServiceRequest
    FillerOrderNumberImagingServiceRequest StorageMediaFileSetID StorageMediaFileSetUID InstanceCreatorUID
    SourceApplicationEntityTitle SendingApplicationEntityTitle ReceivingApplicationEntityTitle
    PrivateInformationCreatorUID PrivateInformation TimezoneOffsetFromUTC InstanceCreationDate InstanceCreationTime
    ReferencedImageSequence SourceImageSequence DeviceDescription PerformedProcedureStepStartTime
    PerformedProcedureStepEndTime ClinicalTrialSponsorName ClinicalTrialSiteName ClinicalTrialSubjectID
""".split())
_EMPTIED = frozenset({"AccessionNumber", "StudyID", "PatientBirthDate", "ReferringPhysicianName"})

# UIDs that name a kind of thing (a SOP class, an encoding, a code scheme), not a patient's instance.
_UID_KEPT = frozenset({"TransferSyntaxUID", "ImplementationClassUID", "CodingSchemeUID", "ContextUID"})

_OPTIONS = (
    ("113100", "Basic Application Confidentiality Profile"),
    ("113107", "Retain Longitudinal Temporal Information Modified Dates Option"),
    ("113108", "Retain Patient Characteristics Option"),
)
METHOD = ("PS3.15 Basic Application Confidentiality Profile", "dates shifted per patient; UIDs HMAC-hashed")


def _digest(secret: str, purpose: str, value: str) -> bytes:
    return hmac.new(secret.encode(), f"{purpose}:{value}".encode(), hashlib.sha256).digest()


def hashed_uid(secret: str, uid: str) -> str:
    """A 2.25 UID derived from `uid` by HMAC: the same input and secret always give the same UID."""
    return "2.25." + str(uuid.UUID(bytes=_digest(secret, "uid", uid)[:16], version=4).int)


def pseudonym(secret: str, patient_key: str) -> str:
    """The pseudonymous PatientID of a patient (20 upper-case hex characters)."""
    return _digest(secret, "patient", patient_key).hex()[:20].upper()


def date_offset_days(secret: str, patient_key: str) -> int:
    """The per-patient shift applied to every date: between 1 and 3650 days into the past."""
    return -(1 + int.from_bytes(_digest(secret, "date", patient_key)[:4], "big") % 3650)


def patient_key(ds: Dataset) -> str:
    """What identifies the patient before de-identification: the ID, else name and birth date, else the study."""
    pid = str(ds.get("PatientID", "") or "").strip()
    if pid:
        return "id:" + pid
    name = str(ds.get("PatientName", "") or "").strip()
    if name:
        return f"name:{name}|{ds.get('PatientBirthDate', '')}"
    return "study:" + str(ds.get("StudyInstanceUID", ""))


def _shift_date(value: str, days: int) -> str:
    try:
        return (dt.datetime.strptime(value[:8], "%Y%m%d") + dt.timedelta(days=days)).strftime("%Y%m%d") + value[8:]
    except ValueError:
        return ""  # a partial or malformed date cannot be shifted, so it goes


def _is_class_uid(keyword: str) -> bool:
    return keyword.endswith("ClassUID") or keyword in _UID_KEPT


class _Scrubber:
    """One de-identification pass over a dataset and all its sequence items."""

    def __init__(self, secret: str, key: str):
        self.secret = secret
        self.days = date_offset_days(secret, key)

    def uid(self, value: str) -> str:
        return value if not value or value in UID_dictionary else hashed_uid(self.secret, value)

    def scrub(self, ds: Dataset) -> None:
        for elem in list(ds):
            tag, vr, keyword = elem.tag, elem.VR, elem.keyword
            if (
                tag.is_private
                or 0x5000 <= tag.group <= 0x50FF  # curves
                or 0x6000 <= tag.group <= 0x60FF  # overlays can hold burned-in text
                or vr in ("UN", "LT", "ST", "UT", "AE")
                or keyword in _REMOVED
                or not keyword  # public tags unknown to the dictionary: nobody can vouch for them
            ):
                del ds[tag]
            elif keyword in _EMPTIED or vr == "PN":
                elem.value = None
            elif keyword == "PatientID":
                elem.value = pseudonym(self.secret, "id:" + str(elem.value)) if elem.value else elem.value
            elif vr == "SQ":
                for item in elem.value:
                    self.scrub(item)
            elif vr == "UI" and not _is_class_uid(keyword):
                elem.value = [self.uid(str(v)) for v in elem.value] if elem.VM > 1 else self.uid(str(elem.value or ""))
            elif vr in ("DA", "DT") and elem.value:
                values = elem.value if elem.VM > 1 else [elem.value]
                shifted = [_shift_date(str(v), self.days) for v in values]
                elem.value = shifted if elem.VM > 1 else shifted[0]
            elif keyword == "PatientAge" and elem.value:
                # HIPAA: ages over 89 are identifying; they are reported as 90.
                text = str(elem.value)
                if text.endswith("Y") and text[:-1].isdigit() and int(text[:-1]) > 89:
                    elem.value = "090Y"


def deidentify(ds: Dataset, *, secret: str) -> tuple[Dataset, list[str]]:
    """A de-identified copy of `ds` (pixels untouched) and warnings for the reader.

    The patient becomes PatientID = pseudonym and PatientName = "ANON^" + its
    first 8 characters, so studies of one patient still group together.
    """
    if not secret:
        raise ValueError("deidentify needs a non-empty secret")
    out = copy.deepcopy(ds)
    key = patient_key(ds)
    scrubber = _Scrubber(secret, key)
    scrubber.scrub(out)
    meta = getattr(out, "file_meta", None)
    if meta is not None:
        scrubber.scrub(meta)
        if "MediaStorageSOPInstanceUID" in meta and "SOPInstanceUID" in out:
            meta.MediaStorageSOPInstanceUID = out.SOPInstanceUID

    patient = pseudonym(secret, key)
    out.PatientID = patient
    out.PatientName = "ANON^" + patient[:8]
    out.PatientIdentityRemoved = "YES"
    out.DeidentificationMethod = list(METHOD)
    codes = Sequence()
    for value, meaning in _OPTIONS:
        code = Dataset()
        code.CodeValue, code.CodingSchemeDesignator, code.CodeMeaning = value, "DCM", meaning
        codes.append(code)
    out.DeidentificationMethodCodeSequence = codes
    out.LongitudinalTemporalInformationModified = "MODIFIED"

    notes: list[str] = []
    if str(ds.get("BurnedInAnnotation", "")).upper() == "YES":
        notes.append(
            "This image has text burned into its pixels (names, dates or IDs may be visible); "
            "check it before sharing, the header alone was cleaned."
        )
    return out, notes
