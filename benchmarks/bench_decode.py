"""Median time to decode and window a real chest radiograph (RG1_UNCI.dcm, 1955x1841, 15-bit).

Run on one core, as the target says:

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python -m benchmarks.bench_decode

It times the whole `ingest_bytes` (parse, checks, decode, modality/VOI,
MONOCHROME1, de-identification, 8-bit rendering), one slider `window()` call,
and, side by side, pydicom's float64 pipeline doing the same rendering. Needs
the `pydicom-data` test dependency for the file.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily


def _radiograph(name: str) -> Path:
    spec = importlib.util.find_spec("data_store")
    if spec is None or not spec.origin:
        sys.exit("pydicom-data is not installed (it is a test dependency: `pip install -e .[test]`)")
    return Path(spec.origin).parent / "data" / name


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: imports, codec plugins, page cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--file", default="RG1_UNCI.dcm", help="a pydicom-data file name")
    args = parser.parse_args()

    import pydicom
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    from orapo_core.imaging import ingest_bytes, window  # noqa: PLC0415 -- loads pydicom, requests

    data = _radiograph(args.file).read_bytes()
    image = ingest_bytes(data, args.file, secret="benchmark")

    def pydicom_pipeline() -> np.ndarray:
        ds = pydicom.dcmread(_radiograph(args.file))
        voi = apply_voi_lut(apply_modality_lut(ds.pixel_array, ds), ds)
        return (255 - np.rint(voi / voi.max() * 255)).astype(np.uint8)

    ingest_ms = _median_ms(lambda: ingest_bytes(data, args.file, secret="benchmark"), args.repeats)
    slider_ms = _median_ms(lambda: window(image.pixels, image.window_center - 2000, 12000), args.repeats)
    reference_ms = _median_ms(pydicom_pipeline, args.repeats)

    print(
        f"command: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} {sys.executable} -m benchmarks.bench_decode {' '.join(sys.argv[1:])}"
    )
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
        f"affinity {len(os.sched_getaffinity(0))} core(s), Python {platform.python_version()}, numpy {np.__version__}, pydicom {pydicom.__version__}"
    )
    print(
        f"file: {args.file} {image.pixels.shape[1]}x{image.pixels.shape[0]}, {image.bits_stored}-bit, "
        f"{image.meta['photometric_interpretation']}, {image.meta['transfer_syntax_name']}; median of {args.repeats}"
    )
    print(f"ingest_bytes (decode + window + de-identify): {ingest_ms:8.1f} ms   target <= 300 ms")
    print(f"window() slider re-render:                    {slider_ms:8.1f} ms")
    print(f"pydicom float64 modality+VOI for comparison:  {reference_ms:8.1f} ms")


if __name__ == "__main__":
    main()
