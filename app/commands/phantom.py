"""Generate PhantomCXR synthetic studies: images, reports and CheXpert labels."""

from __future__ import annotations

import argparse
import sys


def _prevalence(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FINDING=P such as pneumothorax=0.05, not '{text}'") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, required=True, help="number of studies")
    parser.add_argument("--out", required=True, help="output folder (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default 0)")
    parser.add_argument("--size", type=int, default=512, help="image width and height in pixels (default 512)")
    parser.add_argument(
        "--format", choices=("png", "dicom", "both"), default="png", help="image files to write (default png)"
    )
    parser.add_argument("--png-bits", type=int, choices=(8, 16), default=8, help="PNG bit depth (default 8)")
    parser.add_argument(
        "--prevalence",
        type=_prevalence,
        nargs="*",
        default=[],
        metavar="FINDING=P",
        help="override a finding's prevalence, e.g. pneumothorax=0.05 'Pleural Effusion=0.3'",
    )
    parser.add_argument(
        "--conspicuity",
        choices=("clear", "subtle"),
        default="clear",
        help="how visible small findings (nodule, rib fracture, pleural thickening) are drawn: "
        "clear (default) or subtle (the first PhantomCXR rendering, below what 96 px shows)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    from orapo_core.data.phantom import resolve_prevalence, write_dataset  # noqa: PLC0415 -- loads numpy

    prevalence = resolve_prevalence(dict(args.prevalence))  # refuse unknown names before writing anything
    formats = ("png", "dicom") if args.format == "both" else (args.format,)
    step = max(args.n // 10, 1)

    def progress(done: int, total: int) -> None:
        if not args.quiet and (done % step == 0 or done == total):
            print(f"phantom: {done}/{total} studies", file=sys.stderr, flush=True)

    csv_path = write_dataset(
        args.out,
        args.n,
        seed=args.seed,
        size=args.size,
        formats=formats,
        prevalence=prevalence,
        progress=progress,
        png_bits=args.png_bits,
        conspicuity=args.conspicuity,
    )
    print(csv_path)
    return 0
