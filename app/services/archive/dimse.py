"""A DIMSE receiver for modalities and archives that push: a pynetdicom C-STORE SCP (with C-ECHO) whose every
received instance goes through the upload's own `ingest_bytes`.

Only chest radiograph storage classes are offered (CR, DX for presentation and
for processing, secondary capture), in the transfer syntaxes the ingest decodes:
anything else is turned down while the association is negotiated, so a sender
learns at once, and not after the transfer, that an SR or a CT is not for this
node. The instance arrives in memory (pynetdicom's default) and leaves it
de-identified; a refused one is answered with a failure status (0xC000, "cannot
understand") and its error code as the comment, a duplicate with success.

The called AE title must be ours; `allowed_calling` limits who may send (by
calling AE title), as PACS nodes are configured. The server binds to the host
given (127.0.0.1 unless told otherwise, as `orapo serve`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.services.archive.pacs import link_to_archive
from app.services.reading.ingest import ingest_bytes
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from pydicom import Dataset
    from pydicom.uid import UID
    from pynetdicom import AE
    from pynetdicom.events import Event, EventHandlerType
    from pynetdicom.transport import ThreadedAssociationServer

    from app.services.reading.ingest import IngestOutcome
    from db.database import Database
    from orapo_core.config import Settings

STATUS_SUCCESS = 0x0000
STATUS_CANNOT_UNDERSTAND = 0xC000
STATUS_OUT_OF_RESOURCES = 0xA700


@dataclass(frozen=True)
class Received:
    """One C-STORE: who sent it and what the ingest made of it."""

    calling_ae: str
    address: str
    outcome: IngestOutcome


def _contexts() -> tuple[list[UID], list[UID]]:
    from pydicom import uid
    from pynetdicom.sop_class import (  # type: ignore[attr-defined]  # (made by pynetdicom as it loads)
        ComputedRadiographyImageStorage,
        DigitalXRayImageStorageForPresentation,
        DigitalXRayImageStorageForProcessing,
        SecondaryCaptureImageStorage,
    )

    syntaxes = [
        uid.ExplicitVRLittleEndian,
        uid.ImplicitVRLittleEndian,
        uid.DeflatedExplicitVRLittleEndian,
        uid.ExplicitVRBigEndian,
        uid.JPEGBaseline8Bit,
        uid.JPEGExtended12Bit,
        uid.JPEGLosslessSV1,
        uid.JPEGLossless,
        uid.JPEG2000Lossless,
        uid.JPEG2000,
        uid.RLELossless,
    ]
    classes = [
        ComputedRadiographyImageStorage,
        DigitalXRayImageStorageForPresentation,
        DigitalXRayImageStorageForProcessing,
        SecondaryCaptureImageStorage,
    ]
    return classes, syntaxes


def listener(
    *,
    db: Database,
    settings: Settings,
    ae_title: str = "ORAPO",
    allowed_calling: Iterable[str] = (),
    on_receive: Callable[[Received], None] | None = None,
) -> tuple[AE, list[EventHandlerType]]:
    """A pynetdicom `AE` configured as the C-STORE/C-ECHO SCP, and its event handlers, ready to `start_server`."""
    from pynetdicom import AE, evt
    from pynetdicom.sop_class import Verification  # type: ignore[attr-defined]

    title = ae_title.strip()
    if not title or len(title) > 16 or "\\" in title or not title.isprintable():
        raise OrapoError(
            "invalid_ae_title", f"An AE title is 1 to 16 printable characters without a backslash, not {ae_title!r}."
        )
    ae = AE(ae_title=title)
    ae.require_called_aet = True
    allowed = [a.strip() for a in allowed_calling if a.strip()]
    if allowed:
        ae.require_calling_aet = allowed
    classes, syntaxes = _contexts()
    for sop_class in classes:
        ae.add_supported_context(sop_class, syntaxes)
    ae.add_supported_context(Verification)

    def handle_store(event: Event) -> int | Dataset:
        try:
            data = event.encoded_dataset(include_meta=True)
        except Exception:  # a data set pynetdicom cannot encode back: nothing we could ingest
            return STATUS_CANNOT_UNDERSTAND
        try:
            outcome = ingest_bytes(data, "dimse-instance.dcm", db=db, settings=settings, actor="dimse")
            if outcome.ok and outcome.study_id is not None:
                link_to_archive(
                    db, settings, outcome.study_id, str(event.dataset.get("StudyInstanceUID", "") or ""), source="dimse"
                )
        except Exception:  # the database or the disk: the sender may try again later
            return STATUS_OUT_OF_RESOURCES
        finally:
            del data
        if on_receive is not None:
            requestor = event.assoc.requestor
            on_receive(Received(str(requestor.ae_title).strip(), str(requestor.address), outcome))
        if outcome.ok:
            return STATUS_SUCCESS
        from pydicom import Dataset

        status = Dataset()
        status.Status = STATUS_CANNOT_UNDERSTAND
        status.ErrorComment = str(outcome.error)[:64]
        return status

    return ae, [(evt.EVT_C_STORE, handle_store)]


def start_listener(
    *,
    db: Database,
    settings: Settings,
    port: int,
    host: str = "127.0.0.1",
    ae_title: str = "ORAPO",
    allowed_calling: Iterable[str] = (),
    on_receive: Callable[[Received], None] | None = None,
    block: bool = True,
) -> ThreadedAssociationServer | None:
    """Serve until stopped (`block`), or return the running server (`.shutdown()` stops it)."""
    ae, handlers = listener(
        db=db, settings=settings, ae_title=ae_title, allowed_calling=allowed_calling, on_receive=on_receive
    )
    try:
        return ae.start_server((host, int(port)), block=block, evt_handlers=handlers)
    except OSError as exc:
        raise OrapoError(
            "port_in_use",
            f"Cannot listen on {host}:{port} ({exc.strerror}); choose another --port or stop what uses it.",
        ) from None
