"""Every image of a study, by id, for its reader: the viewer's pixels of any of them, and a PNG of each.

`app.services.reading.viewer` serves a study's first image only (the one drafting reads); a study often holds a
frontal and a lateral (issue 41 §6: "the viewer only ever shows the first"), so the page asks for an image by its
id here: the thumbnails of the study, the image the reader clicks, and a prior study's image beside the current
one. The access rule is the one every service asks (`studies.open_study`); an image of another study is not found,
whatever its id.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from PIL import Image

from app.services.reading import drafting
from app.services.reading.studies import open_study
from app.services.reading.viewer import FALLBACK_MAX_SIDE, ViewerImage, image_wire
from db.records import ImageRecord, StudyOverview, UserRecord
from orapo_core.config import Settings
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from db.database import Database

THUMB_MAX_SIDE = 160  # a thumbnail's longest side, in image pixels (the page shows it at 64 px high)


def study_image(db: Database, user: UserRecord, study_id: int, image_id: int) -> tuple[StudyOverview, ImageRecord]:
    """The study (if this user may read it) and its image `image_id`; an image of another study is not found."""
    overview = open_study(db, user, study_id)
    image = next((i for i in overview.images if i.id == image_id), None)
    if image is None:
        raise OrapoError("image_not_found", "This study has no such image.")
    return overview, image


def viewer_image(db: Database, settings: Settings, user: UserRecord, study_id: int, image_id: int) -> ViewerImage:
    """One image of a study as the viewer loads it: the same wire format as the first image's
    (`app.services.reading.viewer.viewer_image`)."""
    overview, image = study_image(db, user, study_id, image_id)
    return image_wire(settings, overview, image)


def image_png(
    db: Database,
    settings: Settings,
    user: UserRecord,
    study_id: int,
    image_id: int,
    preset: str = "default",
    *,
    thumbnail: bool = False,
) -> bytes:
    """One image of a study windowed with a named preset, as a PNG: a thumbnail, or (up to FALLBACK_MAX_SIDE)
    what the viewer shows without its script and a prior's panel shows."""
    _, image = study_image(db, user, study_id, image_id)
    view = drafting.viewer_pixels(settings, image)
    picture = Image.fromarray(drafting.render(view, *drafting.preset(view, preset)))
    side = THUMB_MAX_SIDE if thumbnail else FALLBACK_MAX_SIDE
    if max(picture.size) > side:
        picture.thumbnail((side, side), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    picture.save(out, format="PNG", compress_level=1)
    return out.getvalue()
