"""Plain frozen records the repositories return: never ORM objects.

A record is a snapshot that is safe to hand to a Gradio callback on another
thread or after its session has closed; nothing lazy-loads behind a caller's
back. Timestamps are timezone-aware UTC on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from orapo_core.facts.draft_checks import DraftProblem, check_draft

Role = Literal["radiologist", "admin"]
StudyStatus = Literal["new", "drafted", "corrected", "signed", "trained"]
Split = Literal["train", "holdout"]
PairSource = Literal["clinician_edit", "oracle_step"]
RoundStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "rejected", "promoted"]
RoundTrigger = Literal["manual", "schedule", "threshold"]
VersionStatus = Literal["candidate", "promoted", "rejected", "retired"]

ROLES: tuple[str, ...] = ("radiologist", "admin")
STUDY_STATUSES: tuple[str, ...] = ("new", "drafted", "corrected", "signed", "trained")
SPLITS: tuple[str, ...] = ("train", "holdout")
PAIR_SOURCES: tuple[str, ...] = ("clinician_edit", "oracle_step")
ROUND_STATUSES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled", "rejected", "promoted")
ROUND_TRIGGERS: tuple[str, ...] = ("manual", "schedule", "threshold")
VERSION_STATUSES: tuple[str, ...] = ("candidate", "promoted", "rejected", "retired")
#: When a signed report goes back to the archive as a DICOM SR: never, as it is signed, or only when asked.
SR_SEND_MODES: tuple[str, ...] = ("off", "on_sign", "manual")
#: The worklist orderings a reader opens unread studies from: oldest first, or most useful to the model first.
READING_ORDERS: tuple[str, ...] = ("oldest", "useful")


@dataclass(frozen=True)
class UserRecord:
    id: int
    username: str
    role: str
    active: bool
    must_change_password: bool
    created_at: datetime
    last_login_at: datetime | None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


@dataclass(frozen=True)
class StudyRecord:
    id: int
    study_uid_hash: str
    patient_pseudonym: str
    view_position: str | None
    modality: str | None
    laterality: str | None
    body_part: str | None
    uploaded_by: int | None
    status: str
    split: str
    created_at: datetime
    # why the study is stored but never drafted ("a CT (Modality CT), not a chest radiograph"); None: drafted
    not_drafted: str | None = None


@dataclass(frozen=True)
class ImageRecord:
    id: int
    study_id: int
    dicom_path: str | None
    display_path: str
    width: int
    height: int
    bits_stored: int | None
    source_format: str
    warnings: list[str]
    header: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class DraftRecord:
    id: int
    study_id: int
    model_version_id: int | None
    model_name: str
    prompt: str
    sampling: dict[str, Any]
    text: str
    facts: Any
    sentence_scores: Any
    latency_ms: int | None
    created_by: int | None
    created_at: datetime
    image_features: list[float] | None = None

    @property
    def withheld(self) -> list[str]:
        """The sentences the model said greedily but left out of the draft: too few of its samples said them
        (ORAPO_DRAFT_MIN_AGREEMENT)."""
        facts = self.facts if isinstance(self.facts, dict) else {}
        return [str(s) for s in facts.get("withheld") or []]

    @property
    def added(self) -> list[str]:
        """The sentences the version's finding check put in the draft: it read the finding on the film and the
        model's own words did not state it (orapo_core.models.verifier)."""
        facts = self.facts if isinstance(self.facts, dict) else {}
        return [str(s) for s in facts.get("added") or []]

    @property
    def problems(self) -> list[DraftProblem]:
        """Why the draft must not be signed as it is ([] when it may be): an empty item or section, a sentence
        written twice, a finding stated and denied, a side or severity conflict (`orapo_core.facts.draft_checks`,
        read from the text by the running version's checks, so a draft stored before them is checked too)."""
        return check_draft(self.text)


@dataclass(frozen=True)
class CorrectionRecord:
    id: int
    study_id: int
    draft_id: int | None
    author_id: int
    text: str
    labels: Any
    accepted_unchanged: bool
    signed_at: datetime | None
    version: int
    previous_id: int | None
    trained_in_round: int | None
    created_at: datetime
    reading_order: str | None = None  # the worklist ordering the study was opened from (READING_ORDERS), if any


@dataclass(frozen=True)
class AutosaveRecord:
    """A reader's unsaved report text for a study (`db.models.ReportAutosave`)."""

    user_id: int
    study_id: int
    text: str
    base_version: int
    saved_at: datetime


@dataclass(frozen=True)
class StudyOverview:
    """One row of a worklist: the study with its images and its latest draft and correction."""

    study: StudyRecord
    images: tuple[ImageRecord, ...]
    latest_draft: DraftRecord | None
    latest_correction: CorrectionRecord | None


@dataclass(frozen=True)
class PairRecord:
    id: int
    study_id: int
    image_id: int | None
    prompt: str
    chosen: str
    rejected: str
    source: str
    correction_id: int | None
    round_id: int | None
    created_at: datetime


@dataclass(frozen=True)
class RoundRecord:
    id: int
    status: str
    trigger: str
    config: dict[str, Any]
    progress: float
    metrics: dict[str, Any]
    log: str
    pid: int | None
    output_dir: str | None
    started_by: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None


@dataclass(frozen=True)
class ModelVersionRecord:
    id: int
    name: str
    base_model_path: str
    adapter_path: str | None
    metrics: dict[str, Any]
    parent_id: int | None
    round_id: int | None
    study_ids_seen: list[int]
    config: dict[str, Any]
    status: str
    reason: str | None
    created_by: int | None
    created_at: datetime


@dataclass(frozen=True)
class ScheduleSettings:
    """When rounds start by themselves. Defaults apply until an admin saves settings."""

    cron: str | None = None
    schedule_enabled: bool = False
    corrections_threshold: int | None = None
    threshold_enabled: bool = False
    updated_at: datetime | None = None
    updated_by: int | None = None


@dataclass(frozen=True)
class ArchiveSettings:
    """What the app sends to the archive (which archive is configuration: ORAPO_DICOMWEB_URL). Defaults apply
    until an admin saves settings."""

    sr_send: str = "off"
    updated_at: datetime | None = None
    updated_by: int | None = None


@dataclass(frozen=True)
class AuditEntry:
    id: int
    actor_id: int | None
    actor_name: str
    action: str
    object_type: str | None
    object_id: str | None
    details: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class DashboardCounts:
    studies: int
    studies_by_status: dict[str, int]
    holdout_studies: int
    corrections: int
    signed_corrections: int
    untrained_corrections: int
    pairs: int
    pairs_by_source: dict[str, int]
    accepted_unchanged_rate: float | None
    """Among each study's latest correction; None when there is none yet."""


@dataclass(frozen=True)
class LeaseRecord:
    """A lease as the database saw it when read: times in seconds on the database's clock, `now` included."""

    name: str
    holder: str
    acquired_at: float
    expires_at: float
    now: float

    @property
    def live(self) -> bool:
        return self.expires_at > self.now

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.expires_at - self.now)
