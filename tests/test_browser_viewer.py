"""The Read tab's viewer in a real browser: Cornerstone3D over the 16-bit pixels of RG1_UNCI.dcm.

One app, one signed-in radiologist and one uploaded study for the module; each test starts from Reset. What is
checked is what a reader sees: the canvas's own pixels change while the mouse is still down (live window/level),
the image point under the cursor stays under it while the wheel zooms, the point grabbed follows the pointer
while panning, and a preset can be chosen again after dragging away from it.
"""

from __future__ import annotations

import re
import shutil

import pytest

from tests.support.app import launched_app, make_env
from tests.support.browser import ARTIFACTS
from tests.support.dicom import pydicom_data_file

WAIT = 30_000  # every wait is explicit: 2 shared cores
VIEWER = ".orapo-viewer"
STATE = "() => { const s = document.querySelector('.orapo-viewer').orapoViewer.state(); delete s.frames; return s; }"
NEXT_FRAME = "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))"
# a sum over a sparse grid of the canvas's red channel: changes whenever what is on screen changes
CANVAS_SUM = """(box) => {
  const c = document.querySelector('.orapo-viewport canvas');
  const [x0, y0, w, h] = box || [0, 0, c.width, c.height];
  const d = c.getContext('2d').getImageData(x0, y0, w, h).data;
  let sum = 0, n = 0;
  for (let i = 0; i < d.length; i += 4 * 31) { sum += d[i]; n += 1; }
  return [sum, n];
}"""
WORLD_AT = "([x, y]) => document.querySelector('.orapo-viewer').orapoViewer.viewport.canvasToWorld([x, y])"
SELECTED = """() => { const f = document.querySelector('#orapo-worklist-study :is(input, textarea)');
  return !!f && f.value.trim() !== ''; }"""


@pytest.fixture(scope="module")
def reading(browser, tmp_path_factory):  # `browser`: tests/conftest.py (skipped without Chromium, except in CI)
    """rita, signed in at 1440x900, with RG1_UNCI.dcm uploaded and shown; yields (page, url, settings, db)."""
    from playwright.sync_api import expect

    tmp = tmp_path_factory.mktemp("viewer")
    settings, db = make_env(tmp)
    upload = tmp / "RG1_UNCI.dcm"
    shutil.copy(pydicom_data_file("RG1_UNCI.dcm"), upload)
    ARTIFACTS.mkdir(exist_ok=True)
    with launched_app(settings, db) as (url, _):
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.set_default_timeout(WAIT)
        page.goto(url, timeout=WAIT)
        page.get_by_label("username").fill("rita")
        page.get_by_label("password").fill("rita-pass-1")
        page.get_by_role("button", name="Login").click()
        expect(page.locator("#orapo-whoami")).to_contain_text("Signed in as rita", timeout=WAIT)
        page.locator("input[type=file]").first.set_input_files(str(upload))
        expect(page.locator("#orapo-upload-status")).to_contain_text("Stored RG1_UNCI.dcm", timeout=60_000)
        expect(page.locator(VIEWER)).to_have_attribute("data-state", "ready", timeout=WAIT)
        yield page, url, settings, db
        page.close()


def fresh(page) -> dict:
    """Back to the study as opened (Reset, the W/L tool); its state."""
    page.locator("[data-action=reset]").click()
    page.locator("[data-tool=wl]").click()
    page.evaluate(NEXT_FRAME)
    return page.evaluate(STATE)


def viewport_box(page) -> dict:
    return page.locator(".orapo-viewport").bounding_box()


def header(page) -> dict:
    """The header the pixels came with, as the page fetches them."""
    return page.evaluate("""async () => {
      const src = document.querySelector('.orapo-viewer').dataset.image;
      const r = await fetch(src, { cache: 'no-store' });
      const body = await r.arrayBuffer();
      return { status: r.status, bytes: body.byteLength, ...JSON.parse(r.headers.get('X-Orapo-Image')) };
    }""")


def test_the_viewer_shows_the_16_bit_dicom_after_upload(reading):
    page, *_ = reading
    state = fresh(page)
    meta = header(page)
    assert (meta["status"], meta["dtype"], meta["rows"], meta["columns"]) == (200, "uint16", 1955, 1841)
    assert meta["bytes"] == 1955 * 1841 * 2 and meta["range"][1] > 4095  # the 15-bit values, not an 8-bit PNG
    assert (state["center"], state["width"]) == pytest.approx(tuple(meta["window"]))  # the file's own window
    total, n = page.evaluate(CANVAS_SUM)
    assert 40 < total / n < 215  # a radiograph on screen, neither black nor white
    assert "15-bit" in page.locator("[data-status]").inner_text()
    page.screenshot(path=str(ARTIFACTS / "viewer-1-opened.png"))


@pytest.mark.parametrize("button,tool", [("right", None), ("left", "wl")], ids=["right-drag", "wl-tool"])
def test_dragging_windows_live_while_the_button_is_down(reading, button, tool):
    page, *_ = reading
    before = fresh(page)
    if tool:
        page.locator(f"[data-tool={tool}]").click()
    box = viewport_box(page)
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down(button=button)
    sums, windows = [page.evaluate(CANVAS_SUM)[0]], []
    for step in range(1, 6):
        page.mouse.move(x + 12 * step, y + 8 * step)
        page.evaluate(NEXT_FRAME)
        sums.append(page.evaluate(CANVAS_SUM)[0])
        s = page.evaluate(STATE)
        windows.append((s["center"], s["width"]))
    page.mouse.up(button=button)
    assert len(set(sums)) >= 5, sums  # the canvas changed at (nearly) every move, before the release
    assert len(set(windows)) == 5 and windows[-1] != (before["center"], before["width"])
    assert windows[-1][1] > before["width"] and windows[-1][0] > before["center"]  # right: wider; down: higher


def test_the_wheel_zooms_about_the_cursor(reading):
    page, *_ = reading
    before = fresh(page)
    box = viewport_box(page)
    cursor = (box["width"] * 0.3, box["height"] * 0.35)  # off centre, in the image
    middle = (box["width"] / 2, box["height"] / 2)
    under_cursor, at_middle = page.evaluate(WORLD_AT, cursor), page.evaluate(WORLD_AT, middle)
    page.mouse.move(box["x"] + cursor[0], box["y"] + cursor[1])
    for _ in range(3):
        page.mouse.wheel(0, -120)
        page.evaluate(NEXT_FRAME)
    page.wait_for_function(
        "z => document.querySelector('.orapo-viewer').orapoViewer.state().zoom > z * 1.2",
        arg=before["zoom"],
        timeout=WAIT,
    )
    after = page.evaluate(STATE)
    assert after["zoom"] > before["zoom"] * 1.2
    assert page.evaluate(WORLD_AT, cursor)[:2] == pytest.approx(under_cursor[:2], abs=3)  # image pixels
    assert page.evaluate(WORLD_AT, middle)[:2] != pytest.approx(at_middle[:2], abs=20)  # not a centre zoom
    page.mouse.move(box["x"] + cursor[0], box["y"] + cursor[1])
    for _ in range(6):
        page.mouse.wheel(0, 120)
        page.evaluate(NEXT_FRAME)
    page.wait_for_function(
        "z => document.querySelector('.orapo-viewer').orapoViewer.state().zoom < z", arg=before["zoom"], timeout=WAIT
    )


@pytest.mark.parametrize("button,tool", [("middle", None), ("left", "pan")], ids=["middle-drag", "pan-tool"])
def test_panning_moves_the_image_with_the_pointer(reading, button, tool):
    page, *_ = reading
    fresh(page)
    if tool:
        page.locator(f"[data-tool={tool}]").click()
    box = viewport_box(page)
    start, end = (box["width"] * 0.5, box["height"] * 0.5), (box["width"] * 0.5 + 90, box["height"] * 0.5 + 50)
    grabbed = page.evaluate(WORLD_AT, start)
    page.mouse.move(box["x"] + start[0], box["y"] + start[1])
    page.mouse.down(button=button)
    page.mouse.move(box["x"] + end[0], box["y"] + end[1], steps=6)
    page.mouse.up(button=button)
    page.evaluate(NEXT_FRAME)
    assert page.evaluate(WORLD_AT, end)[:2] == pytest.approx(grabbed[:2], abs=3)  # the grabbed point followed
    assert page.evaluate(STATE)["pan"] != [0, 0]


def test_reset_fit_one_to_one_and_invert(reading):
    page, *_ = reading
    opened = fresh(page)
    box = viewport_box(page)
    centre = [int(box["width"] * 0.4), int(box["height"] * 0.4), int(box["width"] * 0.2), int(box["height"] * 0.2)]
    plain, n = page.evaluate(CANVAS_SUM, centre)
    page.locator("[data-action=invert]").click()
    page.evaluate(NEXT_FRAME)
    inverted, _ = page.evaluate(CANVAS_SUM, centre)
    assert page.evaluate(STATE)["invert"] is True
    assert abs((plain + inverted) / n - 255) < 3  # every pixel v became 255 - v

    page.locator("[data-action=actual]").click()  # one image pixel per screen pixel: a 1955-row image overflows
    assert page.evaluate(STATE)["zoom"] == pytest.approx(1.0, abs=0.01)
    page.locator("[data-action=fit]").click()
    assert page.evaluate(STATE)["zoom"] == pytest.approx(opened["zoom"], rel=0.01)

    page.locator("[data-tool=zoom]").click()  # change everything, then Reset
    page.mouse.move(box["x"] + 200, box["y"] + 200)
    page.mouse.down(button="middle")
    page.mouse.move(box["x"] + 260, box["y"] + 240, steps=4)
    page.mouse.up(button="middle")
    page.mouse.wheel(0, -240)
    page.mouse.down(button="right")
    page.mouse.move(box["x"] + 300, box["y"] + 300, steps=4)
    page.mouse.up(button="right")
    page.evaluate(NEXT_FRAME)
    changed = page.evaluate(STATE)
    assert changed["pan"] != opened["pan"] and changed["zoom"] != opened["zoom"]
    assert changed["center"] != opened["center"] and changed["invert"]
    reset = fresh(page)
    for key in ("center", "width", "zoom"):
        assert reset[key] == pytest.approx(opened[key], rel=1e-3), key
    assert reset["pan"] == pytest.approx(opened["pan"], abs=0.5) and reset["invert"] is False


def test_presets_can_be_chosen_again_and_typed_values_apply_live(reading):
    page, *_ = reading
    fresh(page)
    presets = header(page)["presets"]
    assert set(presets) == {"lung", "mediastinum", "bone", "default", "full"}
    lung = page.locator("button[data-preset=lung]")
    lung.click()
    state = page.evaluate(STATE)
    assert (state["center"], state["width"]) == pytest.approx(tuple(presets["lung"]))
    box = viewport_box(page)
    page.mouse.move(box["x"] + 300, box["y"] + 300)
    page.mouse.down(button="right")
    page.mouse.move(box["x"] + 380, box["y"] + 340, steps=4)
    page.mouse.up(button="right")
    assert page.evaluate(STATE)["width"] != pytest.approx(presets["lung"][1])
    lung.click()  # the same preset again: back to it
    state = page.evaluate(STATE)
    assert (state["center"], state["width"]) == pytest.approx(tuple(presets["lung"]))
    page.locator("button[data-preset=bone]").click()
    assert page.evaluate(STATE)["center"] == pytest.approx(presets["bone"][0])

    width = page.locator("[data-input=width]")
    width.fill("4000")  # applied as typed, no blur needed
    assert page.evaluate(STATE)["width"] == pytest.approx(4000)
    width.press("ArrowUp")  # the arrow keys step the value, and the image follows
    assert page.evaluate(STATE)["width"] == pytest.approx(4001)
    page.locator("[data-input=center]").fill("12000")
    page.locator("[data-input=center]").press("Enter")
    assert page.evaluate(STATE)["center"] == pytest.approx(12000)
    page.screenshot(path=str(ARTIFACTS / "viewer-2-typed-window.png"))


def test_keyboard_shortcuts(reading):
    page, *_ = reading
    opened = fresh(page)
    presets = header(page)["presets"]
    page.locator(".orapo-viewport").click(button="middle")  # focus the viewer without changing anything
    page.keyboard.press("1")
    assert page.evaluate(STATE)["center"] == pytest.approx(presets["lung"][0])
    page.keyboard.press("3")
    assert page.evaluate(STATE)["center"] == pytest.approx(presets["bone"][0])
    page.keyboard.press("i")
    assert page.evaluate(STATE)["invert"] is True
    page.keyboard.press("+")
    assert page.evaluate(STATE)["zoom"] == pytest.approx(opened["zoom"] * 1.25, rel=0.01)
    page.keyboard.press("p")
    assert page.evaluate(STATE)["tool"] == "pan"
    page.keyboard.press("r")
    state = page.evaluate(STATE)
    assert (state["center"], state["invert"]) == (pytest.approx(opened["center"]), False)
    assert state["zoom"] == pytest.approx(opened["zoom"], rel=1e-3)


def in_view(page, name: str) -> None:
    """The whole image, and beside it the report box and the three sign buttons, at 1440 x 900 unscrolled."""
    page.evaluate("() => window.scrollTo(0, 0)")
    height = page.viewport_size["height"]
    image, report = viewport_box(page), page.locator("#orapo-report textarea").bounding_box()
    page.screenshot(path=str(ARTIFACTS / f"viewer-3-layout-1440x900-{name}.png"))
    assert image["y"] >= 0 and image["y"] + image["height"] <= height, image  # the whole image
    assert report["x"] > image["x"] + image["width"]  # beside it, not below
    for selector in ("#orapo-report textarea", "#orapo-accept", "#orapo-save", "#orapo-sign"):
        box = page.locator(selector).bounding_box()
        assert box["y"] >= 0 and box["y"] + box["height"] <= height, (selector, box)


def test_the_image_report_and_sign_buttons_fit_1440_by_900(reading):
    page, *_ = reading
    fresh(page)
    in_view(page, "opened")


def test_with_a_draft_the_report_and_sign_buttons_still_fit_1440_by_900(reading):
    """With a draft (highlights, their legend, the facts of a sentence folded away) and then with a long edited
    report (verdicts, what was contradicted and missed), the report box and the sign buttons still fit."""
    from playwright.sync_api import expect

    from db import DraftRepository, StudyRepository
    from orapo_core.models.prompt import REPORT_PROMPT

    page, url, settings, db = reading
    study = StudyRepository(db).list()[0].study.id
    draft = (
        "Findings: There is a small right pleural effusion. No pneumothorax. Heart size is normal.\n"
        "Impression: Small right pleural effusion."
    )
    DraftRepository(db).create(study, model_name="tiny", prompt=REPORT_PROMPT, text=draft)
    open_from_worklist(page)
    report = page.locator("#orapo-report textarea")
    expect(report).to_have_value(re.compile("pleural effusion"), timeout=WAIT)
    page.locator(".orapo-viewer[data-state=ready]").wait_for(timeout=WAIT)
    in_view(page, "drafted")

    edited = "\n".join(
        [
            "Findings: There is a large left pleural effusion.",
            "No pneumothorax.",
            "Consolidation in the right lower lobe.",
            "Cardiomegaly.",
            "Mild pulmonary edema.",
            "Endotracheal tube 4 cm above the carina.",
            "Right IJ central line tip in the SVC.",
            "No acute osseous abnormality.",
            "Degenerative changes of the thoracic spine.",
            "Impression: Large left pleural effusion, consolidation, cardiomegaly, mild edema.",
            "Lines and tubes as above.",
            "Follow-up radiograph recommended.",
        ]
    )
    report.fill(edited)
    expect(page.locator("#orapo-missed")).to_contain_text("Missed by the draft", timeout=WAIT)
    expect(page.locator("#orapo-highlights")).to_contain_text("contradicted", timeout=WAIT)
    in_view(page, "edited")
    report.fill(draft)  # as opened: nothing unsaved left on the page
    expect(page.locator("#orapo-accept")).to_be_enabled(timeout=WAIT)


def open_from_worklist(page) -> None:
    page.get_by_role("tab", name="Worklist").click()
    page.locator("#orapo-worklist-refresh").click()
    page.locator("#orapo-worklist [data-testid=cell-0-0]").click()
    page.wait_for_function(SELECTED, timeout=WAIT)  # the selection reached the server before Open is pressed
    page.locator("#orapo-worklist-open").click()


def test_without_the_viewer_script_the_server_renders_the_presets(browser, reading):
    from playwright.sync_api import expect

    page, url, *_ = reading
    context = browser.new_context(storage_state=page.context.storage_state())  # rita's session, a new page
    fallback = context.new_page()
    fallback.set_default_timeout(WAIT)
    fallback.route("**/orapo/viewer/assets/**", lambda route: route.abort())
    fallback.goto(url, timeout=WAIT)
    open_from_worklist(fallback)
    root = fallback.locator(VIEWER)
    expect(root).to_have_attribute("data-state", "fallback", timeout=WAIT)
    image = root.locator("img")
    expect(image).to_have_attribute("src", re_ending("render.png?preset=default"), timeout=WAIT)
    fallback.locator("button[data-preset=lung]").click()
    expect(image).to_have_attribute("src", re_ending("render.png?preset=lung"), timeout=WAIT)
    fallback.wait_for_function(
        "() => { const i = document.querySelector('.orapo-viewer img');"
        " return i && i.complete && i.naturalWidth > 0; }",
        timeout=WAIT,
    )
    context.close()


def re_ending(text: str):
    return re.compile(re.escape(text) + "$")
