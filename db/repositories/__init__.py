"""Repositories: each takes a `Database` (one short transaction per call) or a `Session` (join the caller's)."""

from db.repositories.admin import ArchiveSettingsRepository, AuditRepository, DashboardRepository, ScheduleRepository
from db.repositories.base import Actor, Repository
from db.repositories.leases import LeaseRepository
from db.repositories.reports import AutosaveRepository, CorrectionRepository, DraftRepository
from db.repositories.studies import HOLDOUT_FRACTION, ArchiveLinkRepository, StudyRepository, split_for
from db.repositories.training import ROUND_TRANSITIONS, ModelVersionRepository, PairRepository, RoundRepository
from db.repositories.users import UserRepository

__all__ = [
    "ArchiveLinkRepository",
    "ArchiveSettingsRepository",
    "HOLDOUT_FRACTION",
    "ROUND_TRANSITIONS",
    "Actor",
    "AuditRepository",
    "AutosaveRepository",
    "CorrectionRepository",
    "DashboardRepository",
    "DraftRepository",
    "LeaseRepository",
    "ModelVersionRepository",
    "PairRepository",
    "Repository",
    "RoundRepository",
    "ScheduleRepository",
    "StudyRepository",
    "UserRepository",
    "split_for",
]
