"""The archive (a PACS, or any DICOMweb server): find studies (QIDO-RS), pull them in (WADO-RS), send reports back
(STOW-RS), all through `dicomweb-client`.

A pulled study goes through the upload's own `ingest_bytes`, instance by
instance: de-identification, refusals and duplicates are the upload's. The
archive's instances exist only in memory, one at a time: the parsed dataset,
its bytes, and nothing on disk.

The link between a de-identified study and the archive's is a keyed hash, not a
table: the study's stored UID *is* `hashed_uid(secret, archive StudyInstanceUID)`
(the de-identification's own hash), so `search` tells which archive studies are
already imported by hashing what the archive lists, and no archive identifier is
ever stored. The same secret (ORAPO_DEID_SECRET) is needed to recognise them; an
SR sent back carries the de-identified study's UIDs, as every other export does.

Settings are read from the environment by `archive_settings` (ORAPO_DICOMWEB_URL,
ORAPO_DICOMWEB_USER and ORAPO_DICOMWEB_PASSWORD, or ORAPO_DICOMWEB_TOKEN): the
app's settings are moving out of `orapo_core.config` into `app.settings`, and this
one function is what joins them there.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from app.services.reading.ingest import ingest_bytes
from db import ArchiveLinkRepository, StudyRepository
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from dicomweb_client.api import DICOMwebClient

    from app.services.reading.ingest import IngestOutcome
    from db.database import Database
    from db.records import UserRecord
    from orapo_core.config import Settings

_T = TypeVar("_T")

#: The modalities of a chest radiograph; what `search` and `pull` look for unless told otherwise.
CHEST_MODALITIES = ("CR", "DX")
_STUDY_FIELDS = (
    "StudyInstanceUID",
    "StudyDate",
    "StudyTime",
    "AccessionNumber",
    "ModalitiesInStudy",
    "StudyDescription",
    "NumberOfStudyRelatedInstances",
)


@dataclass(frozen=True)
class ArchiveSettings:
    """Where the archive is and how to sign in to it (the password and token are never printed)."""

    url: str
    user: str | None = field(default=None)
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    timeout_s: float = 30.0
    # dicomweb-client's own retry (refused connections and 429/408/503/504), waiting 2, 4, 8, 16 s in between: five
    # attempts take about 30 s before an unreachable archive is reported (ORAPO_DICOMWEB_ATTEMPTS)
    attempts: int = 5


def archive_settings(environ: Mapping[str, str] | None = None) -> ArchiveSettings | None:
    """The archive ORAPO_DICOMWEB_URL names (None when unset). Credentials in the URL (`https://user:pw@host/...`)
    count as ORAPO_DICOMWEB_USER/PASSWORD; a token (ORAPO_DICOMWEB_TOKEN) is sent as a Bearer token instead."""
    environ = os.environ if environ is None else environ
    raw = (environ.get("ORAPO_DICOMWEB_URL") or "").strip()
    if not raw:
        return None
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OrapoError(
            "invalid_archive_url",
            f"ORAPO_DICOMWEB_URL must be an http(s) URL of a DICOMweb service "
            f"(like https://pacs.example.org/dicom-web), not {parts.scheme or raw!r}.",
        )
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    user = environ.get("ORAPO_DICOMWEB_USER") or parts.username
    password = environ.get("ORAPO_DICOMWEB_PASSWORD") or parts.password
    token = environ.get("ORAPO_DICOMWEB_TOKEN") or None
    raw_attempts = (environ.get("ORAPO_DICOMWEB_ATTEMPTS") or "5").strip()
    if not raw_attempts.isdigit() or not 1 <= int(raw_attempts) <= 10:
        raise OrapoError(
            "invalid_setting",
            f"ORAPO_DICOMWEB_ATTEMPTS is how many times a request to the archive is "
            f"tried, from 1 to 10, not {raw_attempts!r}.",
        )
    return ArchiveSettings(url, user or None, password or None, token, attempts=int(raw_attempts))


@dataclass(frozen=True)
class ArchiveStudy:
    """One study the archive lists; `imported_study_id` is this app's study made from it, if any."""

    study_uid: str
    date: str
    time: str
    accession: str
    modalities: tuple[str, ...]
    description: str
    instances: int | None
    imported_study_id: int | None = None


@dataclass(frozen=True)
class PulledInstance:
    """One archive instance and what the ingest made of it."""

    study_uid: str
    index: int
    outcome: IngestOutcome


def dicom_date_range(text: str) -> str:
    """A DICOM date or range (QIDO's StudyDate) from `2024-05-01`, `20240501`, `2024-05-01..2024-05-31`,
    `20240501-20240531`, or an open end (`2024-05-01..` or `20240501-`)."""
    text = text.strip()
    if ".." in text:
        start, end = text.split("..", 1)
    elif re.fullmatch(r"\d{8}-\d{0,8}|-\d{8}", text):
        start, end = text.split("-", 1)
    else:
        start, end = text, None
    dates = [_dicom_date(part, text) if part else "" for part in ([start] if end is None else [start, end])]
    if end is None:
        return dates[0]
    if not any(dates) or (all(dates) and dates[0] > dates[1]):
        raise OrapoError("invalid_date", f"{text!r} is not a date range from an earlier to a later date.")
    return f"{dates[0]}-{dates[1]}"


def _dicom_date(part: str, whole: str) -> str:
    digits = part.strip().replace("-", "")
    try:
        return dt.datetime.strptime(digits, "%Y%m%d").strftime("%Y%m%d")
    except ValueError:
        raise OrapoError(
            "invalid_date", f"{whole!r} is not a date: write 2024-05-31, 20240531, or a range 2024-05-01..2024-05-31."
        ) from None


class Archive:
    """One DICOMweb archive, through dicomweb-client; every HTTP failure becomes an error code and a sentence."""

    def __init__(self, settings: ArchiveSettings, client: DICOMwebClient | None = None) -> None:
        self.settings = settings
        self._client = client

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Archive:
        settings = archive_settings(environ)
        if settings is None:
            raise OrapoError(
                "no_archive",
                "No archive is configured: set ORAPO_DICOMWEB_URL to the archive's DICOMweb "
                "URL (and ORAPO_DICOMWEB_USER and ORAPO_DICOMWEB_PASSWORD, or a token).",
            )
        return cls(settings)

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def client(self) -> DICOMwebClient:
        if self._client is None:
            import requests
            from dicomweb_client.api import DICOMwebClient

            session = requests.Session()
            if self.settings.token:
                session.headers["Authorization"] = f"Bearer {self.settings.token}"
            elif self.settings.user:
                session.auth = (self.settings.user, self.settings.password or "")
            self._client = DICOMwebClient(self.settings.url, session=session, timeout=self.settings.timeout_s)
            self._client.set_http_retry_params(max_attempts=self.settings.attempts)
        return self._client

    def _call(self, what: str, fn: Callable[..., _T], *args: Any, missing: str | None = None, **kwargs: Any) -> _T:
        """`fn(*args, **kwargs)`; with `missing`, a 404 is `archive_study_not_found` with that sentence."""
        import requests

        try:
            return fn(*args, **kwargs)
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if status == 404 and missing:
                raise OrapoError("archive_study_not_found", missing) from None
            if status in (401, 403):
                raise OrapoError(
                    "archive_auth",
                    f"The archive at {self.url} refused the credentials ({status}) while "
                    f"{what}; check ORAPO_DICOMWEB_USER/PASSWORD or the token.",
                ) from None
            raise OrapoError("archive_error", f"The archive at {self.url} answered {status} while {what}.") from None
        except requests.RequestException as exc:
            raise OrapoError(
                "archive_unreachable",
                f"The archive at {self.url} could not be reached while {what} "
                f"({type(exc).__name__}); check ORAPO_DICOMWEB_URL.",
            ) from None

    # --- QIDO-RS -------------------------------------------------------------------------------------------

    def search(
        self,
        *,
        date: str | None = None,
        modalities: Iterable[str] = CHEST_MODALITIES,
        accession: str | None = None,
        limit: int = 200,
    ) -> list[ArchiveStudy]:
        """Studies matching every filter given, one query per modality (ModalitiesInStudy matches one value)."""
        filters: dict[str, str] = {}
        if date:
            filters["StudyDate"] = dicom_date_range(date)
        if accession:
            filters["AccessionNumber"] = accession
        found: dict[str, ArchiveStudy] = {}
        every: list[str | None] = [*modalities] or [None]
        for modality in every:
            query = dict(filters, **({"ModalitiesInStudy": modality} if modality else {}))
            rows = self._call(
                "searching for studies",
                self.client.search_for_studies,
                search_filters=query,
                fields=list(_STUDY_FIELDS),
                limit=limit,
            )
            for row in rows:
                study = _study_from_json(row)
                found.setdefault(study.study_uid, study)
        return sorted(found.values(), key=lambda s: (s.date, s.time, s.study_uid))

    # --- WADO-RS -------------------------------------------------------------------------------------------

    def image_series(self, study_uid: str, modalities: Iterable[str] = CHEST_MODALITIES) -> list[str]:
        """The study's series of these modalities (an SR or a presentation state in the study is not an image)."""
        from pydicom import Dataset

        rows = self._call(
            f"listing the series of study {study_uid}",
            self.client.search_for_series,
            study_instance_uid=study_uid,
            fields=["Modality", "SeriesInstanceUID"],
        )
        if not rows:
            raise OrapoError("archive_study_not_found", f"The archive at {self.url} has no study {study_uid}.")
        wanted = set(modalities)
        series = [Dataset.from_json(row) for row in rows]
        return [str(s.SeriesInstanceUID) for s in series if str(s.get("Modality", "")) in wanted]

    def instances(self, study_uid: str, series_uid: str) -> Iterator[bytes]:
        """Each instance of a series as DICOM bytes, in memory, one at a time."""
        import pydicom

        iterator = self._call(f"retrieving study {study_uid}", self.client.iter_series, study_uid, series_uid)
        while True:
            dataset = self._call(f"retrieving study {study_uid}", next, iterator, None)
            if dataset is None:
                return
            buffer = io.BytesIO()
            pydicom.dcmwrite(buffer, dataset, enforce_file_format=True)
            del dataset
            yield buffer.getvalue()

    def instance_headers(self, study_uid: str) -> list:
        """Every instance of the study as a pydicom Dataset without bulk data (WADO-RS metadata), in memory only:
        what an SR filed in that study copies its patient and study attributes from."""
        from pydicom import Dataset

        gone = f"The archive at {self.url} no longer has the study this one was imported from."
        rows = self._call(
            f"reading the metadata of study {study_uid}", self.client.retrieve_study_metadata, study_uid, missing=gone
        )
        if not rows:
            raise OrapoError("archive_study_not_found", gone)
        return [Dataset.from_json(row, bulk_data_uri_handler=lambda _uri: None) for row in rows]

    # --- STOW-RS -------------------------------------------------------------------------------------------

    def store(self, documents: Iterable[bytes]) -> list[str]:
        """Store DICOM files (say, report SRs) in the archive; the SOP instance UIDs it accepted, or `archive_refused`."""
        import pydicom

        datasets = [pydicom.dcmread(io.BytesIO(data)) for data in documents]
        if not datasets:
            return []
        response = self._call("storing instances", self.client.store_instances, datasets=datasets)
        failed = [str(item.ReferencedSOPInstanceUID) for item in (response.get("FailedSOPSequence") or [])]
        if failed:
            raise OrapoError(
                "archive_refused",
                f"The archive at {self.url} refused {len(failed)} of {len(datasets)} instance(s): {', '.join(failed)}.",
            )
        return [str(item.ReferencedSOPInstanceUID) for item in (response.get("ReferencedSOPSequence") or [])]


def _study_from_json(row: dict) -> ArchiveStudy:
    from pydicom import Dataset

    ds = Dataset.from_json(row)
    modalities = ds.get("ModalitiesInStudy", [])
    modalities = (modalities,) if isinstance(modalities, str) else tuple(str(m) for m in modalities)
    count = ds.get("NumberOfStudyRelatedInstances")
    return ArchiveStudy(
        study_uid=str(ds.StudyInstanceUID),
        date=str(ds.get("StudyDate", "") or ""),
        time=str(ds.get("StudyTime", "") or ""),
        accession=str(ds.get("AccessionNumber", "") or ""),
        modalities=modalities,
        description=str(ds.get("StudyDescription", "") or ""),
        instances=int(count) if count not in (None, "") else None,
    )


def mark_imported(studies: Iterable[ArchiveStudy], *, db: Database, settings: Settings) -> list[ArchiveStudy]:
    """Each study with the id of this app's study made from it, found by hashing its UID with the de-identification
    secret (the only link kept)."""
    from orapo_core.imaging.deid import hashed_uid  # noqa: PLC0415 -- loads pydicom, requests

    repo, secret = StudyRepository(db), settings.secret()
    marked = []
    for study in studies:
        mine = repo.find_by_uid_hash(hashed_uid(secret, study.study_uid))
        marked.append(replace(study, imported_study_id=mine.id if mine is not None else None))
    return marked


def link_to_archive(db: Database, settings: Settings, study_id: int, archive_study_uid: str, *, source: str) -> bool:
    """Remember, sealed, which archive study a de-identified study came from, so that its signed report can be filed
    there (`app.services.archive.export_sr.archive_sr`). Only when the study is that archive study's de-identified copy
    (its hashed UID is the archive UID's hash): a study of another origin is never linked. True when linked."""
    from orapo_core.imaging.deid import hashed_uid, seal_archive_uid  # noqa: PLC0415 -- loads pydicom, requests

    secret = settings.secret()
    study = StudyRepository(db).get(study_id)
    if not archive_study_uid or study is None or study.study_uid_hash != hashed_uid(secret, archive_study_uid):
        return False  # no archive study, or a study of another origin
    ArchiveLinkRepository(db).link(study_id, seal_archive_uid(secret, archive_study_uid), source=source)
    return True


def pull_study(
    archive: Archive,
    study_uid: str,
    *,
    db: Database,
    settings: Settings,
    user: UserRecord | None = None,
    actor: str = "pacs",
) -> Iterator[PulledInstance]:
    """Every image instance of one archive study through the upload's ingest; refusals come back as outcomes."""
    index, linked = 0, set()
    for series_uid in archive.image_series(study_uid):
        for data in archive.instances(study_uid, series_uid):
            index += 1
            outcome = ingest_bytes(
                data, f"archive-instance-{index}.dcm", db=db, settings=settings, user=user, actor=actor
            )
            del data
            if outcome.ok and outcome.study_id is not None and outcome.study_id not in linked:
                link_to_archive(db, settings, outcome.study_id, study_uid, source="dicomweb")
                linked.add(outcome.study_id)
            yield PulledInstance(study_uid, index, outcome)
