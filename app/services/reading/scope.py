"""Only chest radiographs are drafted: the refusal, the pixel check before a first draft, and what the reader reads.

Ingest decides from the header and cheap pixel facts (`orapo_core.imaging.scope`)
and stores the reason with the study (`studies.not_drafted`). Here:

- `refuse_not_drafted`: drafting such a study is refused ("not_a_chest_radiograph",
  with the study's sentence), from the Read tab and from a script alike;
- `screen_pixels`: an image whose header cannot say what it is (PNG, JPEG, a DICOM
  without Modality or with OT) is scored by the drafting model before its first
  draft; one far from every film the model was calibrated on is marked (audited)
  and refused the same way, and stays out of drafting and of the reading order;
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


def screen_pixels(
    db: Any, user: UserRecord, overview: StudyOverview, source_format: str, drafter: Any, pixels: Any
) -> None:
    """Before a study's draft: when its header cannot tell (`has_header_verdict`), the drafting model scores the
    image before its first draft; far from its calibration films, the study is marked as not drafted (and
    audited) and the draft refused. Nothing happens for a chest DICOM, a study drafted before, a model without a
    calibration, or a drafter without the check."""
    from orapo_core.imaging.scope import far_reason, has_header_verdict  # noqa: PLC0415 -- loads pydicom, requests

    study = overview.study
    films = getattr(drafter, "films", None)
    if (
        films is None
        or overview.latest_draft is not None
        or has_header_verdict({"modality": study.modality}, source_format)
    ):
        return  # no check, a study screened at its first draft already, or a chest DICOM
    (score,) = films.score_pictures([drafter.prepare(pixels)])
    if score is None or not score.far:
        return
    with db.session() as session:
        marked = StudyRepository(session).set_not_drafted(study.id, far_reason(score.ratio))
        AuditRepository(session).append(
            "study.not_drafted",
            actor=user,
            object_type="study",
            object_id=study.id,
            details={"unfamiliar": score.to_dict()},
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
