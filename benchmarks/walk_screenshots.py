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
  makes an amendment) -> the worklist's history of the study. The real radiograph is unlike the starter's training
  films: the draft's status line warns so ("This film is unlike the model's training films"), and the draft checks
  flag the starter's draft of it (a finding stated and denied), Accept draft unchanged off;
- the reading room of issue 41, rita again (screenshots 11 to 16): the race (PhantomCXR study A drafted, study B
  uploaded while A's draft runs: the page stays on B and a toast says A's draft is stored with A) -> the switches
  (an unsaved edit of B, then A opened from the Worklist: A shows the draft made while B was open and a toast says
  B's edit is kept; B opened again: the edit is back in the report box, from the server's autosave) -> a non-chest
  refusal (pydicom's CT_small.dcm: stored, and the one-sentence reason it is not drafted) -> a flagged draft (the
  draft of study C with the problems the draft checks find above the report, Accept draft unchanged off) -> the
  model card of the model that wrote it, opened from the Read tab;
- the administrator, boss: the users table -> a training round -> the versions table -> a version's model card
  (the table's first row, the newest version, picked).

The draft is the shipped starter's, a 6 M-parameter model trained on synthetic PhantomCXR films; on a real
radiograph it writes a plausible report, not a reading of this film (the screenshots show the page, not a
model's quality). Two things are arranged rather than waited for: the race holds A's draft at its start until B is
open (`Gate`, in front of the app's own ModelRegistry: the starter still writes it), so B's upload lands while it
runs every time, not only on a slow day; and study C's flagged draft is stored directly as a draft of the starter
(the flawed text tests/test_browser_draft_problems.py scripts: a finding stated and denied, an empty numbered
impression item, as the starter's drafts were seen to write), then C is opened from the Worklist. Issue 41's part
runs between the clinician's and the administrator's and signs nothing, so the round trains on the same studies
with or without it. The round is real but made for speed, as the browser test of rounds makes it
(tests/test_browser_admin_rounds.py): the starter (promoted as version "starter") is trained for two LoRA
steps of the smoke recipe on three signed PhantomCXR studies seeded for omar (and rita's report when her study is
not held out), evaluated on two held-out ones with 8-token drafts, and the default gate decides (promote or reject;
either is what the screenshots show). That took 45 to 90 s on two busy CPU cores; with `--no-round` (or if it has
not ended within --round-timeout seconds) the Rounds tab is shown as it is (the round running, or none) and the
script says so.

Each screenshot is the 1440 x 900 viewport, not the whole page, saved as a PNG with an adaptive 256-colour
palette (about 30 to 230 KB each, the radiograph still readable), 17 in all (01 to 17). The docs' guides show them
(docs/pages/guide/radiologist.md and admin.md).
"""

from __future__ import annotations

import argparse
import io
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from PIL import Image

from tests.support.app import free_port, make_env, phantom_png
from tests.support.browser import CHROMIUM, launch, signed_in
from tests.support.rounds import SMOKE, seed_study

ROOT = Path(__file__).resolve().parents[1]

WIDTH, HEIGHT = 1440, 900
WAIT = 60_000  # every wait is explicit: the app drafts on 2 busy cores
SELECTED = """() => { const f = document.querySelector('#orapo-worklist-study :is(input, textarea)');
  return !!f && f.value.trim() !== ''; }"""
# no event pending on the components under selector `s` (Gradio dims a component while an event it shows runs)
SETTLED = """(s) => [...document.querySelectorAll(s + ' .wrap.full')].every(w => w.classList.contains('hide'))"""
# the toast holding text `t` in full sight: in the viewport and opaque (not still flying in), for its screenshot
TOAST_SHOWN = """(t) => { const b = [...document.querySelectorAll('[data-testid=toast-body]')]
    .find((e) => e.textContent.includes(t));
  if (!b) return false;
  for (let e = b; e; e = e.parentElement) if (parseFloat(getComputedStyle(e).opacity) < 1) return false;
  const r = b.getBoundingClientRect();
  return r.width > 0 && r.left >= 0 && r.top >= 0
    && r.right <= window.innerWidth && r.bottom <= window.innerHeight; }"""
EDITED = (
    "FINDINGS: PA view of the chest. Small left pleural effusion. No focal consolidation. No pneumothorax. "
    "The heart is normal in size.\n\nIMPRESSION: Small left pleural effusion."
)
# the flawed draft tests/test_browser_draft_problems.py scripts (a finding stated and denied, an empty numbered item),
# as the shipped starter's drafts were seen to write
FLAWED = "FINDINGS: Mild cardiomegaly. Heart size is normal.\nIMPRESSION:\n1.\n2. Cardiomegaly."
SWITCH_EDIT = "Small right pleural effusion. No pneumothorax."
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


def take(page, out: Path, shots: list[Path], name: str, scroll_to: str | None, *, bottom: bool) -> None:
    """Scroll (to the top, or `scroll_to` at the screen's bottom with `bottom`, else at its top under the line above
    it), then save the viewport as `out/name` and note it in `shots`."""
    if scroll_to and bottom:  # that element's bottom (its buttons) at the bottom of the screen, the report above it
        script = "(s) => { document.querySelector(s).scrollIntoView({block: 'end'}); window.scrollBy(0, 16); }"
        page.evaluate(script, scroll_to)
    elif scroll_to:  # that element at the top of the screen, the line above it in sight
        script = "(s) => { document.querySelector(s).scrollIntoView({block: 'start'}); window.scrollBy(0, -60); }"
        page.evaluate(script, scroll_to)
    else:
        page.evaluate("() => window.scrollTo(0, 0)")
    shots.append(out / name)
    save_png(page, out / name)


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


class Gate:
    """Holds the next draft at its start, once armed, until released: the race's upload of study B then lands while
    A's draft runs, every time (as tests/test_browser_switches.py holds its fake drafter), not only on a slow day."""

    def __init__(self) -> None:
        self.armed, self.started, self.released = threading.Event(), threading.Event(), threading.Event()

    def arm(self) -> None:
        self.started.clear()
        self.released.clear()
        self.armed.set()

    def release(self) -> None:
        self.armed.clear()
        self.released.set()

    def passing(self) -> None:
        """Called as a draft starts: waits while armed (then disarmed: only that one draft is held)."""
        if self.armed.is_set():
            self.armed.clear()
            self.started.set()
            if not self.released.wait(2 * WAIT / 1000):
                raise RuntimeError("the walk never released the held draft")


def gated_registry(settings, db, gate: Gate):
    """The app's own ModelRegistry (the real starter, loaded, warmed and batched as `orapo serve` does), each draft
    passing `gate` before it is asked of the model."""
    from app.services.reading.registry import ModelRegistry  # noqa: PLC0415 -- loads sqlalchemy, torch

    class GatedBatcher:
        def __init__(self, batcher) -> None:
            self._batcher = batcher

        def __getattr__(self, name: str):
            return getattr(self._batcher, name)

        def draft(self, *args, **kwargs):
            gate.passing()
            return self._batcher.draft(*args, **kwargs)

    class GatedRegistry(ModelRegistry):
        def batcher(self, served):
            return GatedBatcher(super().batcher(served))

    return GatedRegistry(settings, db)


def sign_in(browser, url: str, user: str, password: str):
    """A page signed in as `user`, at the walk's size (the tests' own sign-in)."""
    page = signed_in(browser, url, user, password, viewport=(WIDTH, HEIGHT))[1]
    page.set_default_timeout(WAIT)  # the walk drafts with the real starter: its waits are longer than the tests'
    return page


def clinician(browser, url: str, out: Path, dicom: Path) -> list[Path]:
    from playwright.sync_api import expect

    shots = []

    def shot(name: str, scroll_to: str | None = None) -> None:
        take(page, out, shots, name, scroll_to, bottom=True)

    page = sign_in(browser, url, "rita", "rita-pass-1")
    expect(page.locator("#orapo-model-status")).not_to_contain_text("Loading", timeout=WAIT)  # warmed at start-up
    page.locator("#orapo-files input[type=file]").set_input_files(str(dicom))
    expect(page.locator("#orapo-upload-status")).to_contain_text("Stored RG1_UNCI.dcm", timeout=WAIT)
    expect(page.locator(".orapo-viewer")).to_have_attribute("data-state", "ready", timeout=WAIT)
    shot("01-clinician-upload-dicom.png")

    report = page.locator("#orapo-report textarea")
    page.locator("#orapo-draft").click()
    expect(page.locator("#orapo-status")).to_contain_text(re.compile(r"Draft \d+ by starter"), timeout=WAIT)
    # a real radiograph, unlike the starter's synthetic training films: the status line warns under the report
    expect(page.locator("#orapo-status")).to_contain_text("unlike the model's training films", timeout=WAIT)
    # the draft checks' problems, if any, above the report; Accept draft unchanged is off while any stands
    flagged = "Correct before signing" in page.locator("#orapo-draft-problems").inner_text()
    if flagged:
        expect(page.locator("#orapo-accept")).to_be_disabled(timeout=WAIT)
    else:
        expect(page.locator("#orapo-accept")).to_be_enabled(timeout=WAIT)
    print(
        f"  the starter's draft of RG1_UNCI.dcm is {'flagged' if flagged else 'not flagged'} by the checks", flush=True
    )
    shot("02-clinician-draft.png", scroll_to="#orapo-status")

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


def reading_room(browser, url: str, out: Path, db, gate: Gate, files: dict[str, Path]) -> list[Path]:
    """Issue 41's reading room, as rita: the race, the switches, a non-chest refusal, a flagged draft, the card."""
    from playwright.sync_api import expect

    from db import DraftRepository, UserRepository  # noqa: PLC0415 -- loads sqlalchemy

    shots = []

    def shot(name: str, scroll_to: str | None = None) -> None:
        take(page, out, shots, name, scroll_to, bottom=False)

    def upload(path: Path) -> int:
        """Upload one file through the drop zone; the id of the study it opened."""
        page.locator("#orapo-files input[type=file]").set_input_files(str(path))
        summary = page.locator("#orapo-upload-status")
        expect(summary).to_contain_text(f"Stored {path.name}: study", timeout=WAIT)
        study = int(re.search(rf"Stored {re.escape(path.name)}: study (\d+)", summary.inner_text()).group(1))
        expect(study_line).to_contain_text(f"Study {study} ", timeout=WAIT)
        return study

    def open_from_worklist(study: int) -> None:
        page.get_by_role("tab", name="Worklist").click()
        page.locator("#orapo-worklist-study input").fill(str(study))
        page.locator("#orapo-worklist-open").click()
        expect(study_line).to_contain_text(f"Study {study} ", timeout=WAIT)
        expect(page.locator(".orapo-viewer")).to_have_attribute("data-state", "ready", timeout=WAIT)

    def toast_shot(name: str, text: str) -> None:
        """A screenshot with the toast holding `text` in it: shown in full first, and still there after."""
        page.wait_for_timeout(500)  # its entrance played out
        page.wait_for_function(TOAST_SHOWN, arg=text, timeout=WAIT)
        shot(name)
        if not page.evaluate(TOAST_SHOWN, text):
            raise RuntimeError(f"{name}: the toast ({text!r}) went while the screenshot was taken")

    def no_toasts() -> None:  # the toasts of an earlier step gone (each shows for some seconds), so none is mistaken
        expect(toasts).to_have_count(0, timeout=WAIT)

    page = sign_in(browser, url, "rita", "rita-pass-1")
    study_line, status = page.locator("#orapo-study"), page.locator("#orapo-status")
    report = page.locator("#orapo-report textarea")
    toasts = page.locator("[data-testid=toast-body]")
    expect(page.locator("#orapo-model-status")).not_to_contain_text("Loading", timeout=WAIT)

    # the race: study A drafted, study B uploaded while A's draft runs; the page stays on B, A's draft stays with A
    study_a = upload(files["a"])
    gate.arm()
    page.locator("#orapo-draft").click()
    if not gate.started.wait(WAIT / 1000):
        raise RuntimeError("the draft of study A never started")
    study_b = upload(files["b"])  # while A's draft is held at its start
    gate.release()
    ready = f"The draft of study {study_a} is ready and stored with it"
    stored = toasts.filter(has_text=ready)
    expect(stored).to_have_count(1, timeout=WAIT)
    expect(stored).to_contain_text(f"it shows when you open study {study_a} again", timeout=WAIT)
    expect(study_line).to_contain_text(f"Study {study_b} ", timeout=WAIT)
    expect(report).to_have_value("", timeout=WAIT)
    draft_a = DraftRepository(db).latest_for_study(study_a)
    assert draft_a is not None, "the draft of study A was not stored"
    toast_shot("11-race-draft-of-a-stored-page-stays-on-b.png", ready)

    # the switches: an unsaved edit of B, then A opened from the Worklist (its draft, made while B was open, shows;
    # B's edit is kept on the server), then B opened again: the edit is back in the report box
    no_toasts()
    report.fill(SWITCH_EDIT)
    open_from_worklist(study_a)
    expect(report).to_have_value(draft_a.text, timeout=WAIT)
    kept = f"Your unsaved edit of study {study_b} is kept"
    expect(toasts.filter(has_text=kept)).to_have_count(1, timeout=WAIT)
    toast_shot("12-switch-edit-kept-other-study-opened.png", kept)
    no_toasts()
    open_from_worklist(study_b)
    expect(report).to_have_value(SWITCH_EDIT, timeout=WAIT)
    expect(status).to_contain_text("your unsaved edit", timeout=WAIT)
    shot("13-switch-unsaved-edit-back.png")
    report.fill("")  # she lets it go: no edit of B to keep from here on

    # a non-chest refusal: a CT slice is stored, never drafted, and the study line says why in one sentence
    study_ct = upload(files["ct"])
    expect(study_line).to_contain_text("not drafted", timeout=WAIT)
    expect(status).to_contain_text("not drafted", timeout=WAIT)
    expect(page.locator(".orapo-viewer")).to_have_attribute("data-state", "ready", timeout=WAIT)
    shot("14-not-a-chest-radiograph-not-drafted.png")
    print(f"  study {study_ct}: {study_line.inner_text().splitlines()[-1]}", flush=True)

    # a flagged draft: the starter's flawed draft stored for study C, which then opens with the problems above the
    # report and Accept draft unchanged off
    no_toasts()
    study_c = upload(files["c"])
    rita = UserRepository(db).get_by_username("rita")
    DraftRepository(db).create(
        study_c,
        model_name=draft_a.model_name,
        model_version_id=draft_a.model_version_id,
        prompt=draft_a.prompt,
        sampling=draft_a.sampling,
        text=FLAWED,
        created_by=rita.id,
    )
    open_from_worklist(study_c)
    expect(report).to_have_value(FLAWED, timeout=WAIT)
    problems = page.locator("#orapo-draft-problems")
    expect(problems).to_contain_text("Correct before signing", timeout=WAIT)
    expect(page.locator("#orapo-accept")).to_be_disabled(timeout=WAIT)
    no_toasts()
    shot("15-flagged-draft-problems.png")

    # the model card of the model that wrote the draft, from the Read tab
    panel = page.locator("#orapo-model-card-panel")
    panel.get_by_text("Model card: starter").click()  # opening it checks the card is filled in: wait for that
    card = page.locator("#orapo-model-card")
    expect(card).to_contain_text("Intended use", timeout=WAIT)
    expect(card).to_be_visible(timeout=WAIT)
    page.wait_for_timeout(1000)
    page.wait_for_function(SETTLED, arg="#orapo-model-card-panel", timeout=WAIT)
    shot("16-model-card-read-tab.png", scroll_to="#orapo-model-card-panel")
    page.close()
    return shots


def administrator(browser, url: str, out: Path, *, round_timeout: float, train: bool) -> list[Path]:
    from playwright.sync_api import expect

    shots = []

    def shot(name: str, scroll_to: str | None = None) -> None:
        take(page, out, shots, name, scroll_to, bottom=False)

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

    # a version's model card: a row of the versions table picked, its card below the table
    page.locator("#orapo-versions-table [data-testid=cell-0-1]").click()
    card = page.locator("#orapo-model-card")
    expect(card).to_contain_text("Model card:", timeout=WAIT)
    expect(card).to_contain_text("Intended use", timeout=WAIT)
    page.wait_for_timeout(1000)
    page.wait_for_function(SETTLED, arg="#orapo-model-card", timeout=WAIT)
    print(f"  {card.inner_text().strip().splitlines()[0]}", flush=True)
    shot("17-admin-model-card.png", scroll_to="#orapo-versions-table")
    page.close()
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "pages" / "screenshots", help="where the PNGs go")
    parser.add_argument("--no-round", action="store_true", help="show the Rounds tab without training a round")
    parser.add_argument("--round-timeout", type=float, default=600.0, help="seconds to wait for the round to end")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright
    from pydicom.data import get_testdata_file  # noqa: PLC0415 -- loads pydicom

    from app.server import build_app, launch_options  # noqa: PLC0415 -- loads gradio, sqlalchemy
    from tests.support.dicom import pydicom_data_file  # noqa: PLC0415 -- loads pydicom, requests

    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="orapo-walk-") as tmp:
        root = Path(tmp)
        dicom = root / "upload" / "RG1_UNCI.dcm"
        dicom.parent.mkdir()
        shutil.copy(pydicom_data_file("RG1_UNCI.dcm"), dicom)
        files = {  # issue 41's reading room: PhantomCXR films A, B and C, and a CT slice (pydicom's own CT_small.dcm)
            key: phantom_png(root / "upload" / f"study-{key}.png", seed=seed)
            for key, seed in (("a", 31), ("b", 32), ("c", 33))
        }
        files["ct"] = root / "upload" / "CT_small.dcm"
        shutil.copy(get_testdata_file("CT_small.dcm", download=False), files["ct"])
        settings, db, rounds = prepare(root)
        gate = Gate()
        registry = gated_registry(settings, db, gate)
        demo = build_app(settings=settings, database=db, registry=registry, rounds=rounds, warm_model=True)
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
                shots += reading_room(browser, url, args.out, db, gate, files)
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
