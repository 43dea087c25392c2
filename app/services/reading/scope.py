"""Only chest radiographs are drafted: the refusal, the film check of a first draft, and what the reader reads.

Ingest decides from the header and cheap pixel facts (`orapo_core.imaging.scope`)
and stores the reason with the study (`studies.not_drafted`). Here:

- `refuse_not_drafted`: drafting such a study is refused ("not_a_chest_radiograph",
  with the study's sentence), from the Read tab and from a script alike;
- `screen_draft`: an image whose header cannot say what it is (PNG, JPEG, a DICOM
  without Modality or with OT) is judged by its first draft's unfamiliar-film
  score (the vision features the decoding captured); one far from every film the
  model was calibrated on is marked (audited) and refused the same way, its draft
  never stored or shown, and stays out of drafting and of the reading order;
- `study_note`, `draft_note`: the Read tab's and the worklist's words: why a
  study is not drafted, and the unfamiliar-film warning of a draft.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from db import AuditRepository, StudyRepository
from db.records import DraftRecord, StudyOverview, StudyRecord, UserRecord
from orapo_core.errors import OrapoError

log = logging.getLogger("orapo.drafting")


def not_drafted(study: StudyRecord) -> str | None:
    """The reader's sentence for a study stored but never drafted ("Study 3 is a CT ...: stored, not drafted.")."""
    from orapo_core.imaging.scope import not_drafted_sentence  # noqa: PLC0415 -- loads pydicom, requests

    reason = getattr(study, "not_drafted", None)
    return not_drafted_sentence(study.id, reason) if reason else None


def refuse_not_drafted(study: StudyRecord) -> None:
    """Refuse to draft a study that is not a chest radiograph."""
    sentence = not_drafted(study)
    if sentence:
        raise OrapoError("not_a_chest_radiograph", sentence)


def screen_draft(db: Any, user: UserRecord, overview: StudyOverview, source_format: str, draft: Any) -> None:
    """After a study's first draft, before it is stored: when the header cannot tell (`has_header_verdict`), the
    draft's own unfamiliar-film score (from the vision features its decoding captured: no second pass of the
    vision tower) decides; far from the model's calibration films, the study is marked as not drafted (and
    audited) and the draft refused, never stored or shown. Nothing happens for a chest DICOM, a study drafted
    before, or a draft whose film was not checked (no calibration for the model yet)."""
    from orapo_core.imaging.scope import far_reason, has_header_verdict  # noqa: PLC0415 -- loads pydicom, requests

    study = overview.study
    film = unfamiliar_summary(draft)
    if (
        film is None
        or not film.get("far")
        or overview.latest_draft is not None
        or has_header_verdict({"modality": study.modality}, source_format)
    ):
        return  # not checked, not far, a study screened at its first draft already, or a chest DICOM
    threshold = float(film.get("threshold") or 0.0)
    ratio = float(film["distance"]) / threshold if threshold > 0 else float("inf")
    with db.session() as session:
        marked = StudyRepository(session).set_not_drafted(study.id, far_reason(ratio))
        AuditRepository(session).append(
            "study.not_drafted",
            actor=user,
            object_type="study",
            object_id=study.id,
            details={"unfamiliar": film},
        )
    refuse_not_drafted(marked)


def study_note(study: StudyRecord) -> str:
    """The Read tab's line under a study that is not drafted, else ""."""
    sentence = not_drafted(study)
    return f"**Not drafted.** {sentence} Read the image and write the report yourself." if sentence else ""


def draft_note(draft: DraftRecord | None) -> str:
    """What a draft's status line adds about its film: the unfamiliar-film warning, or that the check did not run
    (no calibration for the model yet); "" for a familiar film or a draft made before the check existed."""
    from orapo_core.models.unfamiliar import WARNING  # noqa: PLC0415 -- loads numpy

    facts = draft.facts if draft is not None and isinstance(draft.facts, dict) else {}
    if "unfamiliar" not in facts:
        return ""
    score = facts["unfamiliar"]
    if not isinstance(score, dict):
        return " · unfamiliar-film check not run (the model has no calibration yet)"
    if score.get("unfamiliar"):
        return f" · **⚠ {WARNING}**"
    return ""


def unfamiliar_summary(draft: Any) -> dict | None:
    """What is stored with a draft about its film (`Draft.unfamiliar`), or None when not checked."""
    score = getattr(draft, "unfamiliar", None)
    return dict(score) if isinstance(score, dict) else None


class BackgroundCalibration:
    """A serving registry's unfamiliar-film calibrations: each model it loads without one is calibrated in a daemon
    thread (`FilmCheck.calibration(build=True)`: a minute or more), its drafts meanwhile marked as not checked.
    `close` stops those under way (between two films) and waits for them, as the server stops."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._checks: list[Any] = []

    def start(self, drafter: Any, name: str) -> None:
        films = getattr(drafter, "films", None)
        if films is None or films.calibration() is not None:
            return
        self._checks.append(films)
        thread = threading.Thread(target=self._run, args=(films, name), name="orapo-film-calibration", daemon=True)
        self._threads.append(thread)
        thread.start()

    @staticmethod
    def _run(films: Any, name: str) -> None:
        from orapo_core.models.unfamiliar import CalibrationStopped  # noqa: PLC0415 -- loads numpy

        try:
            films.calibration(build=True)
            log.info("orapo: the unfamiliar-film check of %s is calibrated", name)
        except CalibrationStopped:
            pass
        except Exception as exc:  # noqa: BLE001 - drafts go on, marked as not checked
            log.warning("orapo: the unfamiliar-film calibration of %s failed: %s", name, type(exc).__name__)

    def close(self, timeout: float) -> bool:
        for films in self._checks:
            films.cancel()
        for thread in self._threads:
            thread.join(timeout)
        return not any(thread.is_alive() for thread in self._threads)
