"""Load: N radiologists at once against the launched app, upload to draft to signed correction.

    OMP_NUM_THREADS=2 taskset -c 0,1 .venv/bin/python -m benchmarks.bench_load [--model DIR] [--rounds 3]

Starts the app as `orapo serve` does (same queue, sign-in and middleware) on a
free local port in a fresh data folder, serving the starter model
(`resolve_model_dir()`, else the shipped one), or `--model DIR`, or with
`--tiny` a tiny random VLM (only a check of the harness: its times say nothing
of the product). Each round, `--readers` signed-in radiologists, each in a
thread with a gradio_client of their own, upload a distinct PhantomCXR image
together, draft it, and save and sign a distinct correction. Upload-to-draft is
the time from starting the upload to the draft arriving, queueing included (the
app decodes drafts together in one running batch, up to eight at a time, a draft
asked meanwhile joining at the next step). The model is loaded before the first round, as
on a server that has already drafted. Afterwards every correction is checked to
be stored exactly once. The goal (2 CPU cores, starter model): median 3 s or less.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from orapo_core.errors import OrapoError
from orapo_core.models.loading import resolve_model_dir
from tests.support.app import launched_app, phantom_png
from tests.support.readers import check_stored_once, corrected_text, make_readers, run_readers, summarize
from tests.support.tiny_vlms import build_tiny_vlm


def served_model(arg: str | None, tiny: bool, workdir: Path) -> tuple[Path, str]:
    if tiny:
        return build_tiny_vlm(workdir / "tiny" / "qwen2_vl", family="qwen2_vl"), "tiny random qwen2_vl (--tiny)"
    if arg:
        return Path(arg).expanduser(), "given with --model"

    try:
        return resolve_model_dir(), "starter (resolve_model_dir)"
    except OrapoError as exc:
        try:
            from orapo_core.models.starter.build import SHIPPED_DIR  # noqa: PLC0415 -- optional: try/except ImportError
        except ImportError:
            SHIPPED_DIR = None
        if SHIPPED_DIR is not None and (Path(SHIPPED_DIR) / "config.json").is_file():
            return Path(SHIPPED_DIR), "shipped starter"
        sys.exit(f"{exc.message}\nOr pass --model DIR, or --tiny to check the harness with a tiny random model.")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (
        f"{platform.platform()}, Python {platform.python_version()}, {cpu}, {cores} usable of {os.cpu_count()} "
        f"CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {load}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a checkpoint folder to serve (default: the starter model)")
    parser.add_argument("--tiny", action="store_true", help="serve a tiny random VLM: checks the harness only")
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=256, help="PhantomCXR image side in pixels")
    args = parser.parse_args()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.reading.registry import ModelRegistry  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    command = shlex.join(
        [
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')}",
            sys.executable,
            "-m",
            "benchmarks.bench_load",
            *sys.argv[1:],
        ]
    )
    print(f"command: {command}")
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="orapo-bench-load-") as tmp:
        workdir = Path(tmp)
        model_dir, which = served_model(args.model, args.tiny, workdir)
        print(f"model:   {model_dir} ({which})")
        settings = Settings(data_dir=workdir / "data", model_dir=model_dir, deid_secret="bench-load")
        db = open_database(settings)
        registry = ModelRegistry(settings, db)
        began = time.perf_counter()
        registry.drafter(registry.served())
        print(f"model load (before the rounds): {time.perf_counter() - began:.1f} s")
        accounts = make_readers(db, args.readers)
        results, walls = [], []
        with launched_app(settings, db, registry) as (url, _demo):
            # one reader alone first, three times (not counted): the first upload and draft import codecs, FactS and
            # the rest; the other two say what one user waits with nobody else drafting
            warm = []
            for i in range(3):
                image = phantom_png(workdir / f"alone-{i}.png", seed=i + 1, size=args.size)
                warm += run_readers(url, accounts[:1], [image], [corrected_text(10**6 + i)])
            alone = [x.upload_to_draft_s for x in warm[1:] if x.upload_to_draft_s is not None]
            print(
                f"one reader alone (not counted): upload->draft {', '.join(f'{t:.2f}' for t in alone)} s "
                f"(first, cold: {warm[0].upload_to_draft_s or float('nan'):.2f} s); readers at once decode "
                f"in one running batch",
                flush=True,
            )
            for r in range(args.rounds):
                images = [
                    phantom_png(workdir / f"cxr-{r}-{i}.png", seed=10_000 * (r + 1) + i, size=args.size)
                    for i in range(args.readers)
                ]
                texts = [corrected_text(r * args.readers + i) for i in range(args.readers)]
                began = time.perf_counter()
                batch = run_readers(url, accounts, images, texts)
                walls.append(time.perf_counter() - began)
                results += batch
                ok = sorted((x for x in batch if x.error is None), key=lambda x: x.upload_to_draft_s)
                print(
                    f"round {r + 1}: {len(ok)}/{len(batch)} ok, wall {walls[-1]:.1f} s, upload->draft (of which upload) "
                    + (" ".join(f"{x.upload_to_draft_s:.1f}({x.upload_s:.1f})" for x in ok) + " s" if ok else "n/a"),
                    flush=True,
                )
        errors = [f"{x.username}: {x.error}" for x in warm + results if x.error]
        stored = "not checked (errors)"
        if not errors:
            try:
                check_stored_once(db, warm + results)
                stored = "every correction stored exactly once"
            except AssertionError as exc:
                stored = f"FAILED: {exc}"
        times = [x.upload_to_draft_s for x in results if x.upload_to_draft_s is not None]
        print(
            f"\n{args.readers} readers x {args.rounds} rounds with {model_dir.name} ({which}), images {args.size} px:"
        )
        if times:
            median, p95 = summarize(times)
            print(
                f"  upload->draft: median {median:.2f} s, p95 {p95:.2f} s, max {max(times):.2f} s over {len(times)} drafts"
                f" (goal: median <= 3 s)"
            )
            full = [x.total_s for x in results if x.total_s is not None]
            print(
                f"  upload->signed: median {statistics.median(full):.2f} s; upload alone: median "
                f"{statistics.median(x.upload_s for x in results if x.upload_s is not None):.2f} s"
            )
        print(f"  wall per round: {', '.join(f'{w:.1f}' for w in walls)} s; total {sum(walls):.1f} s")
        print(f"  errors: {len(errors)}" + "".join(f"\n    {e}" for e in errors))
        print(f"  storage: {stored}")
        print(f"  load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        sys.exit(1 if errors or not stored.startswith("every") else 0)


if __name__ == "__main__":
    main()
