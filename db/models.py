"""SQLAlchemy 2 typed models: the durable state of the product.

Enumerations are short strings guarded by named CHECK constraints rather than
native ENUM types, so adding a status is one migration that behaves the same on
SQLite and PostgreSQL. Every constraint and index is named through the naming
convention, which keeps `alembic` autogenerate and batch migrations on SQLite
deterministic. Nothing here creates an engine.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    DeclarativeBase,
    Mapped,
    mapped_column,
)

from db.records import (
    PAIR_SOURCES,
    READING_ORDERS,
    ROLES,
    ROUND_STATUSES,
    ROUND_TRIGGERS,
    SPLITS,
    SR_SEND_MODES,
    STUDY_STATUSES,
    VERSION_STATUSES,
)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


def _one_of(column: str, values: tuple[str, ...]) -> CheckConstraint:
    allowed = ", ".join(f"'{v}'" for v in values)
    return CheckConstraint(f"{column} IN ({allowed})", name=column)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: DateTime(timezone=True),
        dict[str, Any]: JSON,
        list[Any]: JSON,
        Any: JSON,
    }


class User(Base):
    __tablename__ = "users"
    __table_args__ = (_one_of("role", ROLES),)

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16), default="radiologist")
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    must_change_password: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_login_at: Mapped[datetime | None]


class Study(Base):
    __tablename__ = "studies"
    __table_args__ = (_one_of("status", STUDY_STATUSES), _one_of("split", SPLITS))

    id: Mapped[int] = mapped_column(primary_key=True)
    study_uid_hash: Mapped[str] = mapped_column(String(128), unique=True)
    patient_pseudonym: Mapped[str] = mapped_column(String(128), index=True)
    view_position: Mapped[str | None] = mapped_column(String(16))
    modality: Mapped[str | None] = mapped_column(String(16))
    laterality: Mapped[str | None] = mapped_column(String(8))
    body_part: Mapped[str | None] = mapped_column(String(64))
    uploaded_by: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True)
    status: Mapped[str] = mapped_column(String(16), default="new", index=True)
    split: Mapped[str] = mapped_column(String(8))
    # why the study is stored but never drafted, in words following "Study N is" ("a CT (Modality CT), not a chest
    # radiograph"; orapo_core.imaging.scope); NULL: a chest radiograph, drafted
    not_drafted: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Image(Base):
    __tablename__ = "images"
    __table_args__ = (
        # One row per instance of a study, whoever uploads it and however many upload it at once. A unique index
        # (not a table constraint) so that SQLite adds it without rebuilding a table other rows point at; NULL is
        # a duplicate stored before revision 0002 (kept: a pair may name it) or a row added without the UID.
        Index("uq_images_study_id_sop_instance_uid_hash", "study_id", "sop_instance_uid_hash", unique=True),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    sop_instance_uid_hash: Mapped[str | None] = mapped_column(String(128))
    dicom_path: Mapped[str | None] = mapped_column(String(512))
    display_path: Mapped[str] = mapped_column(String(512))
    width: Mapped[int]
    height: Mapped[int]
    bits_stored: Mapped[int | None]
    source_format: Mapped[str] = mapped_column(String(16))
    warnings: Mapped[list[Any]] = mapped_column(JSON, default=list)
    header: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (
        _one_of("status", VERSION_STATUSES),
        # The database's own guard behind `ModelVersionRepository.promote`: at most one promoted row.
        Index(
            "uq_model_versions_one_promoted",
            "status",
            unique=True,
            sqlite_where=text("status = 'promoted'"),
            postgresql_where=text("status = 'promoted'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    base_model_path: Mapped[str] = mapped_column(String(1024))
    adapter_path: Mapped[str | None] = mapped_column(String(1024))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("model_versions.id"))
    round_id: Mapped[int | None] = mapped_column(ForeignKey("training_rounds.id"), index=True)
    study_ids_seen: Mapped[list[Any]] = mapped_column(JSON, default=list)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="candidate")
    reason: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Draft(Base):
    __tablename__ = "drafts"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    model_version_id: Mapped[int | None] = mapped_column(ForeignKey("model_versions.id"))
    model_name: Mapped[str] = mapped_column(String(256))
    prompt: Mapped[str] = mapped_column(Text)
    sampling: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    text: Mapped[str] = mapped_column(Text)
    facts: Mapped[Any] = mapped_column(JSON, nullable=True)
    sentence_scores: Mapped[Any] = mapped_column(JSON, nullable=True)
    # the image as the language model saw it: the vision merger's output, pooled (orapo_core.models.features)
    image_features: Mapped[Any] = mapped_column(JSON, nullable=True)
    latency_ms: Mapped[int | None]
    created_by: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Correction(Base):
    """A clinician's report for a study. An amendment is a new row, version + 1, never an overwrite."""

    __tablename__ = "corrections"
    __table_args__ = (UniqueConstraint("study_id", "version"), _one_of("reading_order", READING_ORDERS))

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    draft_id: Mapped[int | None] = mapped_column(ForeignKey("drafts.id"))
    author_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    text: Mapped[str] = mapped_column(Text)
    labels: Mapped[Any] = mapped_column(JSON, nullable=True)
    accepted_unchanged: Mapped[bool] = mapped_column(Boolean)
    signed_at: Mapped[datetime | None]
    version: Mapped[int] = mapped_column(Integer, default=1)
    previous_id: Mapped[int | None] = mapped_column(ForeignKey("corrections.id"))
    trained_in_round: Mapped[int | None] = mapped_column(ForeignKey("training_rounds.id"), index=True)
    # The worklist ordering the reader opened the study from ("oldest", "useful"); NULL: not from an ordering.
    reading_order: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ReportAutosave(Base):
    """A reader's unsaved text of a study's report, kept when the page switched away from it (another upload, a
    worklist study, a resumed one) or as it was typed, and offered back when that reader opens the study again.
    One row per reader and study; storing a report, or replacing the edit with a new draft, deletes it."""

    __tablename__ = "report_autosaves"
    __table_args__ = (UniqueConstraint("user_id", "study_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    text: Mapped[str] = mapped_column(Text)
    # the report version the text was edited from, so a version stored since by someone else is noticed
    base_version: Mapped[int] = mapped_column(Integer, default=0)
    saved_at: Mapped[datetime] = mapped_column(default=utcnow)


class PreferencePair(Base):
    __tablename__ = "preference_pairs"
    __table_args__ = (_one_of("source", PAIR_SOURCES),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    image_id: Mapped[int | None] = mapped_column(ForeignKey("images.id"))
    prompt: Mapped[str] = mapped_column(Text)
    chosen: Mapped[str] = mapped_column(Text)
    rejected: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(32))
    correction_id: Mapped[int | None] = mapped_column(ForeignKey("corrections.id"), index=True)
    round_id: Mapped[int | None] = mapped_column(ForeignKey("training_rounds.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class TrainingRound(Base):
    __tablename__ = "training_rounds"
    __table_args__ = (_one_of("status", ROUND_STATUSES), _one_of("trigger", ROUND_TRIGGERS))

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    trigger: Mapped[str] = mapped_column(String(16), default="manual")
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    log: Mapped[str] = mapped_column(Text, default="")
    pid: Mapped[int | None]
    output_dir: Mapped[str | None] = mapped_column(String(1024))
    started_by: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)


class ScheduleSetting(Base):
    """A single row (id = 1): when rounds start by themselves."""

    __tablename__ = "schedule_settings"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    cron: Mapped[str | None] = mapped_column(String(128))
    schedule_enabled: Mapped[bool] = mapped_column(Boolean, default=False)
    corrections_threshold: Mapped[int | None]
    threshold_enabled: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_by: Mapped[int | None] = mapped_column(ForeignKey("users.id"))


class ArchiveSetting(Base):
    """A single row (id = 1): what goes back to the archive, and when."""

    __tablename__ = "archive_settings"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"), _one_of("sr_send", SR_SEND_MODES))

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    sr_send: Mapped[str] = mapped_column(String(16), default="off")
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_by: Mapped[int | None] = mapped_column(ForeignKey("users.id"))


class ArchiveLink(Base):
    """A study imported from the archive (DICOMweb pull, DIMSE receipt) -> the archive's StudyInstanceUID, sealed
    (`orapo_core.imaging.deid.seal_archive_uid`: readable only with the de-identification secret). Its own table,
    read by nothing but the SR sender, so that the signed report can be filed in the archive's own study."""

    __tablename__ = "archive_links"

    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), primary_key=True, autoincrement=False)
    sealed_study_uid: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(16))  # dicomweb | dimse
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditLog(Base):
    """Append-only: the repository has no update or delete, and migrations add triggers refusing both, and
    refusing an insert over an existing id (SQLite's INSERT OR REPLACE) and TRUNCATE (PostgreSQL)."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(primary_key=True)
    actor_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True)
    actor_name: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64), index=True)
    object_type: Mapped[str | None] = mapped_column(String(64))
    object_id: Mapped[str | None] = mapped_column(String(64))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class Lease(Base):
    """A named lease one process holds until `expires_at` unless it renews it (app.services.operations.leader):
    the servers' scheduler election ("scheduler") and each server's sign of life ("server:<host>:<pid>:<start>").

    Times are seconds since the epoch on the database's clock (`LeaseRepository` reads it in the same
    transaction), so servers whose clocks disagree still agree on who holds what."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(191), primary_key=True)
    holder: Mapped[str] = mapped_column(String(191))
    acquired_at: Mapped[float] = mapped_column(Float)
    renewed_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float, index=True)
