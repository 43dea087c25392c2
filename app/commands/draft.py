"""Draft a report for one image (DICOM, PNG or JPEG) with a local model.

The image goes through the same ingest as an upload (decoding, de-identification,
the pixel limit) but nothing is stored, so a throwaway secret is enough. Only a
chest radiograph is drafted (`orapo_core.imaging.scope`): anything else is
refused with `not_a_chest_radiograph`. A draft of a film unlike the model's
training films starts with the warning to read every sentence
(`orapo_core.models.unfamiliar`; `--calibrate` computes the model's calibration
when it has none).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("image", help="a DICOM, PNG or JPEG file")
    parser.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="checkpoint folder (default: ORAPO_MODEL_DIR, else the starter model)",
    )
    parser.add_argument("--adapter", default=None, metavar="DIR", help="a LoRA adapter folder saved by a round")
    parser.add_argument(
        "--samples",
        type=int,
        default=4,
        metavar="K",
        help="sampled drafts used to score each sentence's confidence (default 4; 0 for none)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=192, metavar="N", help="longest draft in tokens")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled drafts")
    parser.add_argument(
        "--min-agreement",
        type=float,
        default=None,
        metavar="SHARE",
        help="leave out a sentence stating a finding that fewer than this share of the samples state "
        "(default ORAPO_DRAFT_MIN_AGREEMENT, as the app drafts; 0 for the greedy draft as it is)",
    )
    parser.add_argument("--json", action="store_true", help="print the draft and its provenance as JSON")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="compute the model's unfamiliar-film calibration first if it has none (once; a minute "
        "or more), so the draft says whether the film is unlike the model's training films",
    )


def run(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415 -- keeps `orapo --help` light
    import secrets  # noqa: PLC0415 -- keeps `orapo --help` light

    from transformers.utils import logging as hf_logging

    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic
    from orapo_core.errors import OrapoError  # noqa: PLC0415 -- keeps `orapo --help` light
    from orapo_core.imaging import ingest_path  # noqa: PLC0415 -- loads pydicom, requests
    from orapo_core.imaging.scope import far_reason, has_header_verdict  # noqa: PLC0415 -- loads pydicom, requests
    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- loads numpy
    from orapo_core.models.loading import (  # noqa: PLC0415 -- keeps `orapo --help` light
        check_model_dir,
        resolve_model_dir,
    )

    # A command-line user needs the draft, not transformers' progress bars and backend notices.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    settings = Settings()
    model_dir = check_model_dir(resolve_model_dir(args.model, settings))  # before the slower image decode
    if not Path(args.image).is_file():
        raise OrapoError("image_not_found", f"There is no file {args.image}.")
    image = ingest_path(args.image, secret=secrets.token_hex(16), max_pixels=settings.max_pixels)
    name = Path(args.image).name
    if image.meta.get("not_drafted"):  # only chest radiographs are drafted (orapo_core.imaging.scope)
        raise OrapoError("not_a_chest_radiograph", f"{name} is {image.meta['not_drafted']}: not drafted.")
    agreement = settings.draft_min_agreement if args.min_agreement is None else args.min_agreement
    drafter = Drafter.from_dir(
        model_dir,
        args.adapter,
        model_version=args.adapter and Path(args.adapter).name,
        min_agreement=agreement,
        calibration_cache=settings.models_dir / "calibrations",
    )
    films = getattr(drafter, "films", None)  # the unfamiliar-film check (orapo_core.models.unfamiliar)
    if films is not None and args.calibrate and films.calibration() is None:
        print("Calibrating the unfamiliar-film check for this model (once; a minute or more)...", file=sys.stderr)
        films.calibration(build=True)
    if films is not None and not has_header_verdict(image.meta, image.source_format):  # PNG, JPEG: the pixels
        (film,) = films.score_pictures([drafter.prepare(image.display)])
        if film is not None and film.far:
            raise OrapoError("not_a_chest_radiograph", f"{name} is {far_reason(film.ratio)}: not drafted.")
    draft = drafter.draft(image.display, samples=args.samples, max_new_tokens=args.max_new_tokens, seed=args.seed)
    # a sentence the version's finding check added is marked where it is listed: its "confidence" would be the
    # samples' agreement with words the model never wrote (`draft.added`, also listed below and in the JSON)
    added = {" ".join(s.split()) for s in draft.added}
    if args.json:
        data = draft.to_dict()
        for sentence in data["sentences"]:
            if " ".join(sentence["text"].split()) in added:
                sentence["added_by_finding_check"] = True
        data["unfamiliar_warning"] = draft.unfamiliar_warning
        print(json.dumps(data, indent=2, default=str))
        return 0
    if draft.unfamiliar_warning:
        print(f"WARNING: {draft.unfamiliar_warning}")
    print(draft.text)
    for sentence in draft.sentences:
        mark = "added" if " ".join(sentence["text"].split()) in added else f"{sentence['confidence']:.2f}"
        print(f"  {mark}  {sentence['text']}")
    for fact in draft.flagged:
        print(f"  flagged: {fact}")
    for sentence in draft.withheld:
        print(
            f"  left out (not confirmed: too few samples said it, or the finding verifier did not find it): {sentence}"
        )
    for sentence in draft.added:
        print(f"  added by the finding check (read on the image, not written by the model): {sentence}")
    if draft.unfamiliar is None:
        print("  unfamiliar-film check not run: this model has no calibration yet (--calibrate computes it once)")
    print(f"({draft.model_name}, prompt {draft.prompt_version}, {draft.latency_ms:.0f} ms)")
    return 0
