"""The Read tab's viewer in headless Chromium: the first frame after opening a study, and frames while dragging.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_viewer [--runs 5] [--drag-seconds 3]

Launches the app in this process as `orapo serve` does (the same `launch_options`: session middleware, viewer
routes), ingests pydicom-data's RG1_UNCI.dcm (1841 x 1955, 15-bit, uncompressed) for rita, and drives Debian's
Chromium, headless, as the browser tests do, at 1440 x 900:

1. open: `--runs` times, a new page of rita's signed-in browser (the viewer's script already in its cache, as
   on any visit after the first) opens the study from the Worklist. Measured from the click on "Open in Read
   tab" to the first frame the viewer renders (Cornerstone's IMAGE_RENDERED), with two parts of it: the
   pixel request (Resource Timing: request to last byte) and the viewer's own time from receiving the address
   to the frame.
2. drag: window/level with the right button held down, one mouse move every 4 ms (more often than frames)
   for `--drag-seconds`: the time between frames rendered during the drag (median and 95th percentile) and
   frames per second.

Both for Cornerstone's CPU path, which the viewer chooses when WebGL is a software rasterizer (as in headless
Chromium here: SwiftShader), and for its GPU path on that same SwiftShader (forced for the measurement with
`window.ORAPO_VIEWER_RENDER = 'gpu'`). Goals: first frame <= 1 s, dragging >= 30 frames/s. Medians of the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]  # as tests/support/browser.py
WAIT_MS = 60_000
FIRST_FRAME_GOAL_MS = 1000.0
FPS_GOAL = 30.0
STATE = "() => { const v = document.querySelector('.orapo-viewer').orapoViewer; return v ? v.state() : null; }"
SELECTED = """() => { const f = document.querySelector('#orapo-worklist-study :is(input, textarea)');
  return !!f && f.value.trim() !== ''; }"""


def pydicom_data_file(name: str) -> Path:
    spec = importlib.util.find_spec("data_store")  # pydicom-data, a test dependency
    if spec is None or not spec.origin:
        sys.exit("pydicom-data is not installed: `make install` installs the test dependencies")
    return Path(spec.origin).parent / "data" / name


@contextlib.contextmanager
def served(data_dir: Path):
    """The app, launched as `orapo serve` launches it, with RG1_UNCI.dcm uploaded by rita; yields the URL."""
    from app.runtime import open_database  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.server import build_app, launch_options  # noqa: PLC0415 -- loads gradio, sqlalchemy
    from app.services.reading import drafting  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from db import UserRepository  # noqa: PLC0415 -- loads sqlalchemy
    from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

    settings = Settings(data_dir=data_dir, deid_secret="bench")
    db = open_database(settings)
    rita = UserRepository(db).create("rita", "rita-pass-1")
    upload = data_dir.parent / "upload" / "RG1_UNCI.dcm"
    upload.parent.mkdir(parents=True)
    shutil.copy(pydicom_data_file("RG1_UNCI.dcm"), upload)
    outcome = drafting.ingest_upload(db, settings, rita, upload)
    assert outcome.ok, outcome.message
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = build_app(settings=settings, database=db)
    demo.queue(default_concurrency_limit=4).launch(
        server_name="127.0.0.1", server_port=port, quiet=True, prevent_thread_lock=True, **launch_options(settings, db)
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        demo.close()


def sign_in(page, url: str) -> None:
    page.goto(url, timeout=WAIT_MS)
    page.get_by_label("username").fill("rita")
    page.get_by_label("password").fill("rita-pass-1")
    page.get_by_role("button", name="Login").click()
    page.locator("#orapo-whoami").filter(has_text="Signed in as rita").wait_for(timeout=WAIT_MS)


def open_study(page, url: str) -> dict:
    """A fresh page opens the study from the Worklist; the first frame's timing, in ms."""
    page.goto(url, timeout=WAIT_MS)
    page.locator(".orapo-viewer[data-state=empty]").wait_for(timeout=WAIT_MS)  # the viewer is up, no study yet
    page.get_by_role("tab", name="Worklist").click()
    page.locator("#orapo-worklist-refresh").click()
    page.locator("#orapo-worklist [data-testid=cell-0-0]").click()
    page.wait_for_function(SELECTED, timeout=WAIT_MS)  # the selection reached the server before Open is pressed
    page.evaluate("""() => document.querySelector('#orapo-worklist-open').addEventListener('click',
                       () => { window.__openedAt = performance.now(); }, { capture: true, once: true })""")
    page.locator("#orapo-worklist-open").click()
    page.locator(".orapo-viewer[data-state=ready]").wait_for(timeout=WAIT_MS)
    return page.evaluate("""() => {
      const s = document.querySelector('.orapo-viewer').orapoViewer.state();
      const fetched = performance.getEntriesByType('resource').find((e) => e.name.includes('/pixels'));
      return { firstFrame: s.firstFrameAt - window.__openedAt, viewer: s.firstFrameMs,
               fetch: fetched ? fetched.responseEnd - fetched.startTime : null,
               bytes: fetched ? fetched.encodedBodySize : null, cpu: s.cpu };
    }""")


def drag(page, seconds: float) -> dict:
    """Right-button window/level across the image; intervals between the frames rendered meanwhile."""
    box = page.locator(".orapo-viewport").bounding_box()
    x0, y0 = box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.3
    page.mouse.move(x0, y0)
    page.mouse.down(button="right")
    began = page.evaluate("() => performance.now()")
    start, moves = time.perf_counter(), 0
    while (t := time.perf_counter() - start) < seconds:
        phase = (t / 1.5) % 2.0
        along = phase if phase <= 1.0 else 2.0 - phase  # back and forth across 40% of the image
        page.mouse.move(x0 + along * box["width"] * 0.4, y0 + along * box["height"] * 0.4)
        moves += 1
        time.sleep(0.004)
    ended = page.evaluate("() => performance.now()")
    page.mouse.up(button="right")
    state = page.evaluate(STATE)
    frames = [f for f in state["frames"] if began <= f <= ended]
    gaps = [b - a for a, b in zip(frames, frames[1:])]
    return {
        "frames": len(frames),
        "moves": moves,
        "fps": (len(frames) - 1) / ((frames[-1] - frames[0]) / 1000),
        "median_ms": statistics.median(gaps),
        "p95_ms": sorted(gaps)[int(0.95 * (len(gaps) - 1))],
        "cpu": state["cpu"],
    }


def measure(browser, url: str, render: str | None, runs: int, seconds: float) -> dict:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    if render:
        context.add_init_script(f"window.ORAPO_VIEWER_RENDER = {render!r};")
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    sign_in(page, url)
    open_study(page, url)  # warm-up: the script into the browser's cache, the server's first decode
    opens = []
    for _ in range(runs):
        page.close()
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        opens.append(open_study(page, url))
    drag(page, 1.0)  # warm-up
    drags = [drag(page, seconds) for _ in range(3)]
    context.close()
    return {"opens": opens, "drags": drags}


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="study openings per rendering path")
    parser.add_argument("--drag-seconds", type=float, default=3.0, help="length of each of the 3 drags")
    args = parser.parse_args()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from playwright.sync_api import sync_playwright

    command = "OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_viewer " + shlex.join(sys.argv[1:])
    version = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True).stdout.strip()
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    print(f"command: {command}")
    print(f"machine: {cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {version}, headless")
    results = {}
    with tempfile.TemporaryDirectory() as tmp, served(Path(tmp) / "data") as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        for name, render in (("auto (CPU path)", None), ("GPU path, SwiftShader", "gpu")):
            results[name] = measure(browser, url, render, args.runs, args.drag_seconds)
        browser.close()
    print(
        f"\nRG1_UNCI.dcm, 1841 x 1955, 15-bit; page 1440 x 900; {args.runs} openings, 3 drags of "
        f"{args.drag_seconds:g} s per path (medians)"
    )
    print(
        f"{'rendering':24} {'first frame':>12} {'pixels GET':>11} {'address->frame':>15} {'drag frame':>11} "
        f"{'p95':>7} {'fps':>6}"
    )
    for name, r in results.items():
        opens, drags = r["opens"], r["drags"]
        print(
            f"{name:24} {median(opens, 'firstFrame'):9.0f} ms {median(opens, 'fetch'):8.0f} ms "
            f"{median(opens, 'viewer'):12.0f} ms {median(drags, 'median_ms'):8.1f} ms "
            f"{median(drags, 'p95_ms'):4.0f} ms {median(drags, 'fps'):6.1f}"
        )
    auto = results["auto (CPU path)"]
    first, fps = median(auto["opens"], "firstFrame"), median(auto["drags"], "fps")
    print(
        f"\ngoals (the path the viewer picks here): first frame {first:.0f} ms <= {FIRST_FRAME_GOAL_MS:.0f} ms: "
        f"{'met' if first <= FIRST_FRAME_GOAL_MS else 'NOT met'}; dragging {fps:.1f} frames/s >= {FPS_GOAL:.0f}: "
        f"{'met' if fps >= FPS_GOAL else 'NOT met'}"
    )
    print(f"pixels transferred per opening: {auto['opens'][0]['bytes'] / 1e6:.1f} MB (uint16, uncompressed)")


if __name__ == "__main__":
    main()
