"""A screenshot walk through the app, as a radiologist and an administrator see it, at 1440 x 900.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.walk_screenshots [--out docs/pages/screenshots] [--no-round]

Starts the app on 127.0.0.1 in a temporary data folder, as `orapo serve` does (the shipped starter copied into the
data folder and warmed as the server starts; the same `launch_options`), with the test suite's three users
(tests/support/app.py: boss, an administrator; rita and omar, radiologists), and drives Debian's Chromium
(/usr/bin/chromium, headless, as the browser tests do) through:

- the clinician, rita: upload a real DICOM (pydicom-data's RG1_UNCI.dcm, 1841 x 1955, 15-bit) -> the viewer at
  full bit depth -> Draft report (the starter's draft, its sentences marked by the model's confidence) -> edit
  the report (the draft's sentences now judged by FactS against the edit, with what it missed) -> Save and sign
  (the confirmation shows the exact text) -> signed -> reopen from the worklist and amend (the page says it
  makes an amendment) -> the worklist's history of the study;
- the administrator, boss: the users table -> a training round -> the versions table.

The draft is the shipped starter's, a 6 M-parameter model trained on synthetic PhantomCXR films; on a real
radiograph it writes a plausible report, not a reading of this film (the screenshots show the page, not a
model's quality). The round is real but made for speed, as the browser test of rounds makes it
(tests/test_browser_admin_rounds.py): the starter (promoted as version "starter") is trained for two LoRA
steps of the smoke recipe on three signed PhantomCXR studies seeded for omar (and rita's report when her study is
not held out), evaluated on two held-out ones with 8-token drafts, and the default gate decides (promote or reject;
either is what the screenshots show). That took 60 to 90 s on two busy CPU cores; with `--no-round` (or if it has
not ended within --round-timeout seconds) the Rounds tab is shown as it is (the round running, or none) and the
script says so.

Each screenshot is the 1440 x 900 viewport, not the whole page, saved as a PNG with an adaptive 256-colour
palette (about 30 to 230 KB each, the radiograph still readable). The docs' guides show them
(docs/pages/guide/radiologist.md and admin.md).
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

from tests.support.app import free_port, make_env
from tests.support.browser import CHROMIUM, launch, signed_in
from tests.support.rounds import SMOKE, seed_study

ROOT = Path(__file__).resolve().parents[1]

WIDTH, HEIGHT = 1440, 900
WAIT = 60_000  # every wait is explicit: the app drafts on 2 busy cores
SELECTED = """() => { const f = document.querySelector('#orapo-worklist-study :is(input, textarea)');
  return !!f && f.value.trim() !== ''; }"""
EDITED = (
    "FINDINGS: PA view of the chest. Small left pleural effusion. No focal consolidation. No pneumothorax. "
    "The heart is normal in size.\n\nIMPRESSION: Small left pleural effusion."
)
# two LoRA steps of the smoke recipe: what tests/test_browser_admin_rounds.py trains with
OVERRIDES = "\n".join(
    [
        "max_steps=2",
        "max_completion_length=8",
        "per_device_train_batch_size=4",
        "num_generations=2",
        "use_peft=true",
        "lora_r=4",
        "lora_alpha=8",
        "lora_target_modules=[q_proj, v_proj]",
    ]
)


def save_png(page, path: Path) -> int:
    """The viewport as a palette PNG; its size in bytes."""
    image = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    size = path.stat().st_size
    print(f"  {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}  {size / 1024:.0f} KB", flush=True)
    return size


def prepare(root: Path):
    """(settings, database, round scheduler) of a data folder with the starter promoted and studies for a round."""
    from app.services.rounds import RoundPolicy, RoundService  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from app.services.rounds.schedule import RoundScheduler  # noqa: PLC0415 -- loads sqlalchemy, pydantic_settings
    from db import ModelVersionRepository, UserRepository  # noqa: PLC0415 -- loads sqlalchemy
    from orapo_core.data import load_dataset  # noqa: PLC0415 -- loads numpy
    from orapo_core.data.phantom import write_dataset  # noqa: PLC0415 -- loads numpy
    from orapo_core.models.starter.build import copy_shipped_starter  # noqa: PLC0415 -- loads numpy

    starter = root / "data" / "models" / "starter"
    starter.parent.mkdir(parents=True, exist_ok=True)
    if not copy_shipped_starter(starter):
        sys.exit(
            "the shipped starter (assets/starter/) is missing or was built with other settings: "
            "`orapo starter build` first"
        )
    settings, db = make_env(root, starter)
    settings.ensure_dirs()
    base = ModelVersionRepository(db).create("starter", base_model_path=str(starter))
    ModelVersionRepository(db).promote(base.id)
    # omar's signed reports: what the round trains on (three) and checks the candidate on (two held out)
    write_dataset(root / "phantom", 5, seed=3, size=64)
    omar = UserRepository(db).get_by_username("omar")
    for record in load_dataset(root / "phantom")[:3]:
        seed_study(db, settings, record, author=omar)
    for record in load_dataset(root / "phantom")[3:5]:
        seed_study(db, settings, record, author=omar, split="holdout")
    policy = RoundPolicy(recipe=SMOKE, min_heldout=1, eval_max_new_tokens=8, poll_s=0.5)
    return settings, db, RoundScheduler(db, settings, service=RoundService(db, settings, policy=policy))


def sign_in(browser, url: str, user: str, password: str):
    """A page signed in as `user`, at the walk's size (the tests' own sign-in)."""
    page = signed_in(browser, url, user, password, viewport=(WIDTH, HEIGHT))[1]
    page.set_default_timeout(WAIT)  # the walk drafts with the real starter: its waits are longer than the tests'
    return page


def clinician(browser, url: str, out: Path, dicom: Path) -> list[Path]:
    from playwright.sync_api import expect

    shots = []

    def shot(name: str, scroll_to: str | None = None) -> None:
        if scroll_to:  # that element's bottom (its buttons) at the bottom of the screen, the report above it
            page.evaluate(
                "(s) => { document.querySelector(s).scrollIntoView({block: 'end'}); window.scrollBy(0, 16); }",
                scroll_to,
            )
        else:
            page.evaluate("() => window.scrollTo(0, 0)")
        shots.append(out / name)
        save_png(page, out / name)

    page = sign_in(browser, url, "rita", "rita-pass-1")
    expect(page.locator("#orapo-model-status")).not_to_contain_text("Loading", timeout=WAIT)  # warmed at start-up
    page.locator("#orapo-files input[type=file]").set_input_files(str(dicom))
    expect(page.locator("#orapo-upload-status")).to_contain_text("Stored RG1_UNCI.dcm", timeout=WAIT)
    expect(page.locator(".orapo-viewer")).to_have_attribute("data-state", "ready", timeout=WAIT)
    shot("01-clinician-upload-dicom.png")

    report = page.locator("#orapo-report textarea")
    page.locator("#orapo-draft").click()
    expect(page.locator("#orapo-status")).to_contain_text("Draft", timeout=WAIT)
    expect(page.locator("#orapo-accept")).to_be_enabled(timeout=WAIT)
    shot("02-clinician-draft.png")

    # the reader's own report, whatever the draft said: what FactS then checks the draft's sentences against
    report.fill(EDITED)
    edited = EDITED
    expect(page.locator("#orapo-accept")).to_be_disabled(timeout=WAIT)
    expect(page.locator("#orapo-missed")).to_contain_text("Missed by the draft", timeout=WAIT)
    shot("03-clinician-edit-checked-by-facts.png")

    page.locator("#orapo-sign").click()
    expect(page.locator("#orapo-confirm-text textarea")).to_have_value(edited, timeout=WAIT)
    expect(report).to_be_disabled(timeout=WAIT)  # locked while the confirmation shows: the event has ended
    shot("04-clinician-sign-confirm.png", scroll_to="#orapo-confirm")
    page.locator("#orapo-confirm-sign").click()
    expect(page.locator("#orapo-status")).to_contain_text("corrected and signed by rita", timeout=WAIT)
    shot("05-clinician-signed.png")

    page.get_by_role("tab", name="Worklist").click()
    expect(page.locator("#orapo-worklist")).to_contain_text("signed", timeout=WAIT)
    page.locator("#orapo-worklist [data-testid=cell-0-0]").click()
    page.wait_for_function(SELECTED, timeout=WAIT)
    page.locator("#orapo-worklist-open").click()
    expect(page.locator("#orapo-status")).to_contain_text("saving now makes an amendment", timeout=WAIT)
    expect(page.locator(".orapo-viewer")).to_have_attribute("data-state", "ready", timeout=WAIT)
    amended = edited + "\nAddendum: heart size is normal."
    report.fill(amended)
    page.locator("#orapo-sign").click()
    expect(page.locator("#orapo-confirm-question")).to_contain_text("amendment", timeout=WAIT)
    expect(report).to_be_disabled(timeout=WAIT)
    shot("06-clinician-amend-confirm.png", scroll_to="#orapo-confirm")
    page.locator("#orapo-confirm-sign").click()
    expect(page.locator("#orapo-status")).to_contain_text("an amendment of signed version 1", timeout=WAIT)

    page.get_by_role("tab", name="Worklist").click()
    page.locator("#orapo-worklist-refresh").click()
    page.locator("#orapo-worklist [data-testid=cell-0-0]").click()
    expect(page.locator("#orapo-worklist-history")).to_contain_text("report v2", timeout=WAIT)
    shot("07-clinician-worklist-history.png")
    page.close()
    return shots


def administrator(browser, url: str, out: Path, *, round_timeout: float, train: bool) -> list[Path]:
    from playwright.sync_api import expect

    shots = []

    def shot(name: str, scroll_to: str | None = None) -> None:
        if scroll_to:  # that element at the top of the screen, under its heading
            page.evaluate(
                "(s) => { document.querySelector(s).scrollIntoView({block: 'start'}); window.scrollBy(0, -60); }",
                scroll_to,
            )
        else:
            page.evaluate("() => window.scrollTo(0, 0)")
        shots.append(out / name)
        save_png(page, out / name)

    page = sign_in(browser, url, "boss", "admin-pass-1")
    page.get_by_role("tab", name="Admin").click()
    expect(page.locator("#orapo-users")).to_contain_text("omar", timeout=WAIT)
    shot("08-admin-users.png")

    page.get_by_role("tab", name="Rounds").click()
    expect(page.locator("#orapo-versions-table")).to_contain_text("starter", timeout=WAIT)
    status = page.locator("#orapo-round-status")
    if train:
        page.locator("#orapo-round-overrides textarea").fill(OVERRIDES)
        page.locator("#orapo-start-round").click()
        expect(page.locator("#orapo-rounds-result")).to_contain_text("Round 1 started", timeout=WAIT)
        began = time.monotonic()
        try:
            expect(status).to_contain_text("Gate:", timeout=int(round_timeout * 1000))
            print(f"  the round ended in {time.monotonic() - began:.0f} s", flush=True)
        except AssertionError:
            print(f"  the round had not ended after {round_timeout:.0f} s: shown as it is", flush=True)
    else:
        print("  --no-round: the Rounds tab without a round", flush=True)
    shot("09-admin-round.png", scroll_to="#orapo-rounds-table")
    shot("10-admin-versions.png", scroll_to="#orapo-versions-table")
    page.close()
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "pages" / "screenshots", help="where the PNGs go")
    parser.add_argument("--no-round", action="store_true", help="show the Rounds tab without training a round")
    parser.add_argument("--round-timeout", type=float, default=600.0, help="seconds to wait for the round to end")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    from app.server import build_app, launch_options  # noqa: PLC0415 -- loads gradio, sqlalchemy
    from tests.support.dicom import pydicom_data_file  # noqa: PLC0415 -- loads pydicom, requests

    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="orapo-walk-") as tmp:
        root = Path(tmp)
        dicom = root / "upload" / "RG1_UNCI.dcm"
        dicom.parent.mkdir()
        shutil.copy(pydicom_data_file("RG1_UNCI.dcm"), dicom)
        settings, db, rounds = prepare(root)
        demo = build_app(settings=settings, database=db, rounds=rounds, warm_model=True)
        port = free_port()
        demo.queue(default_concurrency_limit=4).launch(
            server_name="127.0.0.1",
            server_port=port,
            quiet=True,
            prevent_thread_lock=True,
            **launch_options(settings, db),
        )
        url = f"http://127.0.0.1:{port}"
        print(f"app at {url}, data in {root}; Chromium {CHROMIUM}, {WIDTH}x{HEIGHT}", flush=True)
        try:
            with sync_playwright() as playwright:
                browser = launch(playwright)
                shots = clinician(browser, url, args.out, dicom)
                shots += administrator(
                    browser, url, args.out, round_timeout=args.round_timeout, train=not args.no_round
                )
                browser.close()
        finally:
            demo.close()
    print(f"{len(shots)} screenshots in {args.out} in {time.monotonic() - began:.0f} s", flush=True)
    print(
        "command: OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.walk_screenshots"
        + (" --no-round" if args.no_round else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
