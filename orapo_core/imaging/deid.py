"""De-identification of a DICOM header at ingest (DICOM PS3.15 Annex E).

Which attribute gets which action comes from one maintained source: Table
E.1-1 of PS3.15 as shipped, per edition of the standard, by the
`dicom-anonymizer` package (`dicomanonymizer.dicom_anonymization_databases`,
edition `TABLE_EDITION`; one list of tags per Basic Profile action). Only its
table is used, loaded lazily on the first de-identification: its anonymizer
draws random UIDs and fixed dummy dates, where this project needs keyed,
repeatable ones. `dicom-anonymizer` was preferred over `deid` (pydicom/deid),
whose shipped recipes are a pixel-cleaning filter plus a few dozen header
actions, not the table, and over `dicognito`, which has anonymizer classes by
VR and element name but no per-attribute table; `dicom-anonymizer` ships the
whole table (about 650 attributes), regenerated from the standard for each new
edition. A test fails when the installed package ships a newer edition than
`TABLE_EDITION`.

The Basic Application Level Confidentiality Profile is applied with:

- the Retain Longitudinal Temporal Information with Modified Dates Option:
  every date (DA, DT) of the table, except the birth date, moves by one keyed
  offset per patient (whole days, so intervals between studies survive and a
  time of day (TM) keeps its value);
- the Retain Patient Characteristics Option for sex, sex neutered, age, size,
  weight, pregnancy and smoking status (what a chest report uses; ages over 89
  become 090Y). Ethnic group and the free-text characteristics the option
  would have cleaned (allergies, patient state, pre-medication, special
  needs) are removed.

Not applied: Clean Descriptors (descriptions and comments are removed, not
cleaned: nothing can vouch for free text), Retain Device or Institution
Identity, Retain UIDs, Retain Safe Private. The profile's actions become: X,
and the compound X/Z, X/D, X/Z/D, X/Z/U* remove; Z, Z/D and D empty the value
(a dummy is only needed for Type 1 conformance of IODs this project never
writes; the patient's name and ID get pseudonyms); U and a UID under D become
a keyed hash. Software Versions, not in the table, is removed as well.

Beyond the table, five safety nets catch what a vendor put where the table
does not look: every person name is emptied, every free-text (LT/ST/UT) and AE
value is removed, every non-standard UID is replaced, private, overlay,
curve and unknown-VR or unknown-tag elements are dropped, and so is every
attribute the table omits whose keyword names a birth or death date, an
accession, placer or filler (order) number, or a "...Number" of the request
group 0040 (the alternative-calendar birth and death dates and the retired
order numbers, which no edition shipped lists, identify a patient as well as
the attributes the table does list), at every depth of every sequence; other
dates are shifted like those of the table. Pseudonyms, date offsets and UIDs
are keyed HMACs of a secret, so they are stable across uploads and useless
without the secret.

Last, every value of a structured VR (DA, DT, TM, AS, DS, IS, CS, UI) must
conform to PS3.5 6.2, or its element goes: a field that should hold a time or
a code but holds a word is free text in disguise (it may be a name), and it
would stop any reader that parses it, such as the SR export. The Type 2
attributes every image instance carries are emptied instead (see
`_EMPTIED_WHEN_INVALID`); the reader is told that values were dropped, never
which.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import functools
import hashlib
import hmac
import importlib
import re
import uuid

from cryptography.fernet import Fernet, InvalidToken
from pydicom._uid_dict import UID_dictionary  # noqa: TID253 -- this module is heavy; light ones import it lazily
from pydicom.dataset import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    Dataset,
    FileMetaDataset,
)
from pydicom.sequence import Sequence  # noqa: TID253 -- this module is heavy; light ones import it lazily
from pydicom.uid import PYDICOM_IMPLEMENTATION_UID  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.errors import OrapoError

# The edition of PS3.15 Table E.1-1 used, a module of dicomanonymizer.dicom_anonymization_databases
# (dicom-anonymizer 2.1.0 ships 2023, 2024b and 2026c).
TABLE_EDITION = "dicomfields_2026c"

# The table's lists, one per Basic Profile action.
_TABLE_LISTS = {
    "D_TAGS": "D",
    "Z_TAGS": "Z",
    "X_TAGS": "X",
    "U_TAGS": "U",
    "Z_D_TAGS": "Z/D",
    "X_Z_TAGS": "X/Z",
    "X_D_TAGS": "X/D",
    "X_Z_D_TAGS": "X/Z/D",
    "X_Z_U_STAR_TAGS": "X/Z/U*",
}

# Retain Patient Characteristics Option, as applied here (see the module docstring).
_RETAINED = frozenset(
    {
        "PatientSex",
        "PatientSexNeutered",
        "PatientAge",
        "PatientSize",
        "PatientWeight",
        "PregnancyStatus",
        "SmokingStatus",
    }
)
# Dates of the table that the Modified Dates Option does not cover: they keep the profile's action.
_NOT_SHIFTED = frozenset({"PatientBirthDate", "PatientBirthTime"})
# Not in Table E.1-1, removed all the same.
_ALSO_REMOVED = frozenset({"SoftwareVersions"})
# Not in Table E.1-1 either (no edition dicom-anonymizer ships lists (0010,0033), (0010,0034), (0040,1006),
# (0040,1007), (0040,2006) or (0040,2007)), yet a birth or death date and an order number identify a patient as
# surely as those the table lists: a rule on the keyword, so that every attribute of the kind goes, not a list.
_IDENTIFYING_KEYWORD = re.compile(r"(Birth|Death)(Date|Time)|Accession|Placer|Filler|OrderNumber")
# Binary numbers (counts, frame and row numbers) are no identifiers, whatever their keyword says.
_BINARY_NUMBERS = frozenset({"US", "SS", "UL", "SL", "FL", "FD", "SV", "UV", "AT"})

# Written into every stored file's meta in place of the sender's (0002,0013); at most 16 characters.
IMPLEMENTATION_VERSION_NAME = "ORAPO_DEID_1"

# UIDs that name a kind of thing (a SOP class, an encoding, a code scheme), not a patient's instance.
_UID_KEPT = frozenset({"TransferSyntaxUID", "ImplementationClassUID", "CodingSchemeUID", "ContextUID"})

_OPTIONS = (
    ("113100", "Basic Application Confidentiality Profile"),
    ("113107", "Retain Longitudinal Temporal Information Modified Dates Option"),
    ("113108", "Retain Patient Characteristics Option"),
)
METHOD = (
    "PS3.15 Basic Application Confidentiality Profile",
    f"Table E.1-1 {TABLE_EDITION.removeprefix('dicomfields_')}; dates shifted per patient; UIDs HMAC-hashed",
)


@functools.cache
def profile_table() -> tuple[dict[int, str], tuple[tuple[int, int, str], ...]]:
    """Table E.1-1: {tag: Basic Profile action} and the masked rows as (value, mask, action).

    The masked rows are the repeating groups (curves 50xx, overlays 60xx).
    Imported here, not at module level, so that importing the imaging package
    stays light.
    """
    module = importlib.import_module(f"dicomanonymizer.dicom_anonymization_databases.{TABLE_EDITION}")
    exact: dict[int, str] = {}
    masked: list[tuple[int, int, str]] = []
    for name, action in _TABLE_LISTS.items():
        for row in getattr(module, name):
            if len(row) == 2:
                exact[(row[0] << 16) | row[1]] = action
            else:
                masked.append(((row[0] << 16) | row[1], (row[2] << 16) | row[3], action))
    if len(exact) < 600:  # a truncated table would silently let attributes through
        raise RuntimeError(f"PS3.15 Table E.1-1 ({TABLE_EDITION}) has only {len(exact)} attributes")
    return exact, tuple(masked)


def basic_action(tag: int) -> str | None:
    """The Basic Profile action of Table E.1-1 for `tag` (e.g. 'X', 'Z/D', 'U'); None if the table omits it."""
    exact, masked = profile_table()
    action = exact.get(tag)
    if action is None:
        action = next((a for value, mask, a in masked if tag & mask == value), None)
    return action


@functools.lru_cache(maxsize=4096)
def action(tag: int, vr: str, keyword: str) -> str | None:
    """What this project does to an attribute of the table, options applied; None if it is not in the table.

    'K' keep, 'C' shift the date, 'U' keyed hash, 'Z' empty, 'X' remove.
    """
    basic = basic_action(tag)
    if basic is None:
        return "X" if keyword in _ALSO_REMOVED or _identifying_outside_table(tag, vr, keyword) else None
    if keyword in _RETAINED:
        return "K"
    if vr in ("DA", "DT", "TM") and keyword not in _NOT_SHIFTED:
        return "C"
    if basic == "U" or (basic == "D" and vr == "UI"):
        return "U"
    if basic in ("Z", "Z/D", "D"):
        return "Z"
    return "X"


def _identifying_outside_table(tag: int, vr: str, keyword: str) -> bool:
    """Whether an attribute the table omits names a birth or death date, an accession, placer or filler (order)
    number, or is a textual "...Number" of group 0040 (Modality Worklist and Procedure Step: orders and requests)."""
    return bool(_IDENTIFYING_KEYWORD.search(keyword)) or (
        tag >> 16 == 0x0040 and keyword.endswith("Number") and vr not in _BINARY_NUMBERS
    )


def _digest(secret: str, purpose: str, value: str) -> bytes:
    return hmac.new(secret.encode(), f"{purpose}:{value}".encode(), hashlib.sha256).digest()


def hashed_uid(secret: str, uid: str) -> str:
    """A 2.25 UID derived from `uid` by HMAC: the same input and secret always give the same UID."""
    return "2.25." + str(uuid.UUID(bytes=_digest(secret, "uid", uid)[:16], version=4).int)


def _link_cipher(secret: str) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(_digest(secret, "archive-link", "fernet-key-v1")))


def seal_archive_uid(secret: str, uid: str) -> str:
    """An archive's StudyInstanceUID, encrypted and authenticated (Fernet, a key derived from the secret): the one
    way back from a de-identified study to the archive's study, so that its signed report can be filed there.

    Unlike the hashed UIDs it can be undone, but only with the secret; a new token each time (random IV)."""
    return _link_cipher(secret).encrypt(uid.encode()).decode("ascii")


def unseal_archive_uid(secret: str, token: str) -> str:
    """The archive UID `seal_archive_uid` sealed; `archive_link_invalid` with another secret or a changed token."""
    try:
        return _link_cipher(secret).decrypt(token.encode("ascii")).decode()
    except (InvalidToken, ValueError, UnicodeError):
        raise OrapoError(
            "archive_link_invalid",
            "The link to the archive's study cannot be read with this "
            "de-identification secret (ORAPO_DEID_SECRET changed?).",
        ) from None


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
                or not keyword  # public tags unknown to the dictionary: nobody can vouch for them
            ):
                del ds[tag]
                continue
            if keyword == "PatientID":  # Z/D in the table: a pseudonym, so studies of one patient still group
                elem.value = pseudonym(self.secret, "id:" + str(elem.value)) if elem.value else elem.value
                continue
            todo = action(int(tag), vr, keyword)
            if todo == "X" or (todo == "U" and vr != "UI"):
                del ds[tag]
            elif todo == "Z" or (todo is None and vr == "PN"):
                elem.value = Sequence() if vr == "SQ" else None
            elif vr == "SQ":  # kept by an option or outside the table: clean every item
                for item in elem.value:
                    self.scrub(item)
            elif vr == "UI" and (todo == "U" or (todo is None and not _is_class_uid(keyword))):
                elem.value = [self.uid(str(v)) for v in elem.value] if elem.VM > 1 else self.uid(str(elem.value or ""))
            elif vr in ("DA", "DT") and elem.value and todo in ("C", None):
                values = elem.value if elem.VM > 1 else [elem.value]
                shifted = [_shift_date(str(v), self.days) for v in values]
                elem.value = shifted if elem.VM > 1 else shifted[0]
            elif keyword == "PatientAge" and elem.value:
                # HIPAA: ages over 89 are identifying; they are reported as 90.
                text = str(elem.value)
                if text.endswith("Y") and text[:-1].isdigit() and int(text[:-1]) > 89:
                    elem.value = "090Y"


# PS3.5 6.2: what one value of each structured VR may be, its padding stripped (DA and DT are checked further
# for a real calendar day; IS for its 32-bit range; DS for a finite number).
_HHMMSS = r"(?:[01]\d|2[0-3])(?:[0-5]\d(?:(?:[0-5]\d|60)(?:\.\d{1,6})?)?)?"
_VALUE_FORMS = {
    "DA": re.compile(r"(?P<y>\d{4})(?P<m>\d{2})(?P<d>\d{2})"),
    "DT": re.compile(
        r"(?P<y>\d{4})(?:(?P<m>\d{2})(?:(?P<d>\d{2})(?:" + _HHMMSS + r")?)?)?(?:[+-](?:0\d|1[0-4])[0-5]\d)?"
    ),
    "TM": re.compile(_HHMMSS),
    "AS": re.compile(r"\d{3}[DWMY]"),
    "DS": re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"),
    "IS": re.compile(r"[+-]?\d+"),
    "CS": re.compile(r"[A-Z0-9 _]*"),
    "UI": re.compile(r"(?:0|[1-9]\d*)(?:\.(?:0|[1-9]\d*))*"),
}
_MAX_CHARS = {"DA": 8, "DT": 26, "TM": 13, "AS": 4, "DS": 16, "IS": 12, "CS": 16, "UI": 64}
# Type 2 and 2C attributes of the modules every image instance has (Patient, General Study, General Series,
# General Image: PS3.3 C.7.1.1, C.7.2.1, C.7.3.1, C.7.6.1): a bad value of one of them is emptied, not removed,
# since an empty Type 2 element is how DICOM says "unknown", where a missing one makes the stored instance
# non-conformant. Every other bad value is removed: a Type 3 attribute may be absent, and for a Type 1 one an
# empty value breaks the rule as much as a missing one does (and would pass for a value to a lax reader).
_EMPTIED_WHEN_INVALID = frozenset(
    {
        "PatientBirthDate",
        "PatientSex",
        "StudyDate",
        "StudyTime",
        "SeriesNumber",
        "Laterality",
        "InstanceNumber",
        "PatientOrientation",
        "ContentDate",
        "ContentTime",
    }
)

NONCONFORMANT_NOTE = (
    "Some header values did not conform to DICOM and were dropped; the image and the rest of its header are kept."
)


def conforms(vr: str, value: object) -> bool:
    """Whether one value (a str, or pydicom's number types for DS/IS) is one PS3.5 6.2 allows for `vr`.

    Empty is allowed (an element with no value). Only the VRs of `_VALUE_FORMS` are checked; any other is True.
    """
    form = _VALUE_FORMS.get(vr)
    if form is None or value is None:
        return True
    text = str(value).strip(" \x00")  # leading and trailing spaces are padding, a trailing NUL a UID's
    if not text:
        return True
    match = form.fullmatch(text) if len(text) <= _MAX_CHARS[vr] else None
    if match is None:
        return False
    if vr in ("DA", "DT"):
        try:
            dt.date(int(match["y"]), int(match["m"] or 1), int(match["d"] or 1))
        except ValueError:
            return False
    if vr == "IS":
        return -(2**31) <= int(text) < 2**31
    if vr == "DS":
        return float(text) not in (float("inf"), float("-inf"))
    return True


def drop_nonconformant(ds: Dataset) -> int:
    """Remove (or empty, see `_EMPTIED_WHEN_INVALID`) every element, at any depth, with a value that does not
    conform to its VR; the number of elements changed. A multi-valued element goes whole if one value is bad."""
    changed = 0
    for elem in list(ds):
        if elem.VR == "SQ":
            for item in elem.value:
                changed += drop_nonconformant(item)
            continue
        if elem.VR not in _VALUE_FORMS or elem.value is None:
            continue
        values = elem.value if elem.VM > 1 else [elem.value]
        if all(conforms(elem.VR, v) for v in values):
            continue
        changed += 1
        if elem.keyword in _EMPTIED_WHEN_INVALID:
            elem.value = None
        else:
            del ds[elem.tag]
    return changed


ZERO_PREAMBLE = b"\x00" * 128


def fresh_file_meta(source: FileMetaDataset | None, ds: Dataset) -> FileMetaDataset:
    """File Meta Information holding only what PS3.10 needs, taken from `ds` and the source's
    transfer syntax; the implementation identifiers are pydicom's, not the sender's."""
    meta = FileMetaDataset()
    sop_class = ds.get("SOPClassUID") or (source.get("MediaStorageSOPClassUID") if source is not None else None)
    if sop_class:
        meta.MediaStorageSOPClassUID = sop_class
    if "SOPInstanceUID" in ds:
        meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    if source is not None and "TransferSyntaxUID" in source:
        meta.TransferSyntaxUID = source.TransferSyntaxUID
    meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    meta.ImplementationVersionName = IMPLEMENTATION_VERSION_NAME
    return meta


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
    nonconformant = drop_nonconformant(out)  # after the scrub: a date it shifted is checked as it will be stored
    # The File Meta Information is written afresh, never scrubbed: its Private Information
    # (0002,0102), Implementation Version Name (0002,0013) and source AE titles are free text
    # the sender chose. The 128-byte preamble is free for any use too, and some modalities put
    # the patient there, so it becomes zeros.
    out.file_meta = fresh_file_meta(getattr(ds, "file_meta", None), out)
    if hasattr(out, "preamble"):
        out.preamble = ZERO_PREAMBLE

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
    if nonconformant:  # which ones is not said: the values may be the very PHI that was dropped
        notes.append(NONCONFORMANT_NOTE)
    return out, notes
