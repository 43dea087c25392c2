"""Durable state: SQLAlchemy models, repositories returning frozen records, Alembic migrations.

Importing `db` creates no engine and opens no file; `Database(url)` connects on
first use. Typical use from a Gradio callback::

    db = Database.from_settings(settings)
    user = UserRepository(db).authenticate(name, password)
    study = StudyRepository(db).create(uid_hash, pseudonym, uploaded_by=user.id)
"""

from db.database import Database
from db.repositories import (
    ArchiveLinkRepository,
    ArchiveSettingsRepository,
    AuditRepository,
    AutosaveRepository,
    CorrectionRepository,
    DashboardRepository,
    DraftRepository,
    LeaseRepository,
    ModelVersionRepository,
    PairRepository,
    RoundRepository,
    ScheduleRepository,
    StudyRepository,
    UserRepository,
)

__all__ = [
    "ArchiveLinkRepository",
    "ArchiveSettingsRepository",
    "AuditRepository",
    "AutosaveRepository",
    "CorrectionRepository",
    "DashboardRepository",
    "Database",
    "DraftRepository",
    "LeaseRepository",
    "ModelVersionRepository",
    "PairRepository",
    "RoundRepository",
    "ScheduleRepository",
    "StudyRepository",
    "UserRepository",
]
