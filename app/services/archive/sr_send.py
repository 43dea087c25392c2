"""Signed reports back to the archive as DICOM SRs: when (an admin's setting), in the background on signing, and
what happened last.

The setting (`off`, `on_sign`, `manual`) is stored in the database like the
round schedule; which archive is configuration (ORAPO_DICOMWEB_URL, read by
`app.services.archive.pacs.archive_settings`). With `on_sign` and an archive, signing
starts one short-lived thread that builds the study's SR and stores it with
STOW-RS: the reader's signature is already committed and never waits for, or
fails because of, the archive. Every send, done or failed, is an audit entry
(`sr.sent`, `sr.send_failed`) and a log line; the last one is what the admin
sees. `manual` sends only when asked: `orapo export sr ... --send`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.services.accounts.auth import require_role
from app.services.archive.export_sr import archive_sr
from app.services.archive.pacs import Archive, archive_settings
from db import ArchiveSettingsRepository, AuditRepository
from db.records import SR_SEND_MODES, AuditEntry, UserRecord
from orapo_core.config import Settings
from orapo_core.errors import OrapoError, log_line

if TYPE_CHECKING:
    from db.database import Database
    from db.repositories.base import Actor

log = logging.getLogger(__name__)

#: What each mode means, in an admin's words (the Admin tab's choices).
SR_SEND_LABELS = {"off": "off", "on_sign": "on sign", "manual": "manual"}
SENT, FAILED = "sr.sent", "sr.send_failed"


@dataclass(frozen=True)
class SrSend:
    """One attempt to store a study's SR in the archive: `error` is empty when it was stored."""

    study_id: int
    archive: str
    sop_instance_uid: str = ""
    error: str = ""
    message: str = ""
    in_archive_study: bool = False  # filed in the archive's own study (the study was imported from it)

    @property
    def ok(self) -> bool:
        return not self.error


def sr_send_mode(db: Database) -> str:
    return ArchiveSettingsRepository(db).get().sr_send


def set_sr_send_mode(db: Database, user: UserRecord, mode: str) -> str:
    """An admin's choice of when signed reports go to the archive (refused to anyone else)."""
    require_role(user, "admin")
    mode = {label: key for key, label in SR_SEND_LABELS.items()}.get(mode, mode)
    return ArchiveSettingsRepository(db).update(sr_send=mode, actor=user).sr_send


def send_report(
    db: Database, settings: Settings, study_id: int, archive: Archive, *, actor: Actor = None, trigger: str = "on_sign"
) -> SrSend:
    """Build the study's SR and store it in `archive`; never raises: a failure is returned, audited and logged."""
    try:
        report = archive_sr(db, settings, study_id, archive)
        archive.store([report.data])
        result = SrSend(
            study_id, archive.url, sop_instance_uid=report.sop_instance_uid, in_archive_study=report.in_archive_study
        )
    except OrapoError as exc:
        result = SrSend(study_id, archive.url, error=exc.code, message=exc.message)
    except Exception as exc:  # noqa: BLE001 - a background send must end in an audit entry, whatever broke
        log.error("sending the SR of study %s to %s failed: %s", study_id, archive.url, log_line(exc))
        result = SrSend(
            study_id,
            archive.url,
            error="sr_send_failed",
            message=f"The report could not be sent ({type(exc).__name__}).",
        )
    details = {"archive": result.archive, "trigger": trigger}
    details.update(
        {
            "sop_instance_uid": result.sop_instance_uid,
            "filed_in": "archive study" if result.in_archive_study else "de-identified study",
        }
        if result.ok
        else {"error": result.error, "message": result.message}
    )
    if not result.ok:  # the code only: a message can quote what the archive answered about the study
        log.warning("SR of study %s not stored in %s: %s", study_id, archive.url, result.error)
    try:
        AuditRepository(db).append(
            SENT if result.ok else FAILED, actor=actor, object_type="study", object_id=study_id, details=details
        )
    except Exception as exc:  # noqa: BLE001 - the database gone away: the log line is all that is left
        log.error("could not audit the SR send of study %s: %s", study_id, log_line(exc))
    return result


def after_signing(
    db: Database,
    study_id: int,
    *,
    actor: Actor = None,
    settings: Settings | None = None,
    environ: Mapping[str, str] | None = None,
) -> threading.Thread | None:
    """With `on_sign` and an archive configured, start sending the study's SR in the background and return the
    thread (callers never need to wait; tests do); otherwise do nothing. Never raises."""
    try:
        if sr_send_mode(db) != "on_sign":
            return None

        configured = archive_settings(environ)
        if configured is None:
            return None
        if settings is None:
            settings = Settings()
    except Exception as exc:  # noqa: BLE001 - signing is done; a wrong archive setting must not undo it
        log.warning("SR of study %s not sent: %s", study_id, exc)

        try:
            AuditRepository(db).append(
                FAILED,
                actor=actor,
                object_type="study",
                object_id=study_id,
                details={
                    "trigger": "on_sign",
                    "error": getattr(exc, "code", "sr_send_failed"),
                    "message": getattr(exc, "message", str(exc)),
                },
            )
        except Exception as audit_exc:  # noqa: BLE001
            log.error("could not audit the SR send of study %s: %s", study_id, log_line(audit_exc))
        return None
    thread = threading.Thread(
        target=send_report,
        args=(db, settings, study_id, Archive(configured)),
        kwargs={"actor": actor},
        name=f"orapo-sr-send-{study_id}",
        daemon=True,
    )
    thread.start()
    return thread


def send_now(db: Database, settings: Settings, user: UserRecord, study_id: int | None) -> SrSend:
    """An admin sends one study's SR at once, whatever the setting (the manual mode's button; a retry after a
    failed send). The outcome is audited like a background send."""
    require_role(user, "admin")
    if study_id is None:
        raise OrapoError("no_study", "Enter the number of the study whose signed report to send.")
    return send_report(db, settings, study_id, Archive.from_environment(), actor=user, trigger="manual")


def last_send(db: Database) -> AuditEntry | None:
    """The newest SR send, done or failed."""
    entries = AuditRepository(db).query(action="sr.", limit=20)
    return next((e for e in entries if e.action in (SENT, FAILED)), None)


def status_markdown(db: Database, environ: Mapping[str, str] | None = None) -> str:
    """The archive, the setting and the last send, for the Admin tab."""
    try:
        configured = archive_settings(environ)
        where = (
            f"Archive: **{configured.url}**."
            if configured
            else "No archive is configured (set ORAPO_DICOMWEB_URL): reports are not sent anywhere."
        )
    except OrapoError as exc:
        where = f"The archive setting is wrong: {exc.message}"
    lines = [where, f"Signed reports go back as DICOM SR: **{SR_SEND_LABELS[sr_send_mode(db)]}**."]
    last = last_send(db)
    if last is None:
        lines.append("Last SR send: none yet.")
    elif last.action == SENT:
        filed = {
            "archive study": ", in the archive's own study",
            "de-identified study": ", as a de-identified study",
        }.get(last.details.get("filed_in", ""), "")
        lines.append(
            f"Last SR send: study {last.object_id}, stored in {last.details.get('archive', 'the archive')}"
            f"{filed} at {last.created_at:%Y-%m-%d %H:%M} UTC."
        )
    else:
        lines.append(
            f"Last SR send: **failed** for study {last.object_id} at {last.created_at:%Y-%m-%d %H:%M} UTC "
            f"({last.details.get('error', '')}: {last.details.get('message', '')})."
        )
    return "\n\n".join(lines)


__all__ = [
    "SR_SEND_LABELS",
    "SR_SEND_MODES",
    "SrSend",
    "after_signing",
    "last_send",
    "send_now",
    "send_report",
    "set_sr_send_mode",
    "sr_send_mode",
    "status_markdown",
]
