"""The shipped starter sees what is in the image: a phantom with a common finding gets a report that says so.

A real check: an untrained model, or one that writes the most common report
whatever the image, fails it. For each common finding, studies are drawn with
that finding forced present (the rest at PhantomCXR's defaults) from fixed
seeds, drafted greedily through the product's `Drafter`, labelled by FactS,
and a majority must carry the finding (positive or uncertain, as CheXpert
metrics count it). Normal studies must mostly come back with no finding.
"""

from __future__ import annotations

import numpy as np
import pytest

from orapo_core.models.starter.build import SHIPPED_DIR

pytestmark = pytest.mark.slow  # the shipped starter drafting

STUDIES_PER_FINDING = 20  # five gave a 3-of-5 majority that a retrained starter passes or fails by one draft
COMMON = {
    "cardiomegaly": "Cardiomegaly",
    "pleural_effusion": "Pleural Effusion",
    "edema": "Edema",
    "consolidation": "Consolidation",
    "support_devices": "Support Devices",
}


@pytest.fixture(scope="module")
def drafter():
    from orapo_core.models import Drafter

    if not (SHIPPED_DIR / "config.json").is_file():
        # Until a build that passes these checks is committed; once it is, they are the gate.
        pytest.skip(f"no starter shipped under {SHIPPED_DIR} (`orapo starter build --out {SHIPPED_DIR}`)")
    return Drafter.from_dir(SHIPPED_DIR)


def _drafted_labels(drafter, kind: str | None) -> list[dict]:
    from orapo_core.data.phantom import DEFAULT_PREVALENCE, generate_study
    from orapo_core.facts import label_report

    prevalence = {k: 0.0 for k in DEFAULT_PREVALENCE} if kind is None else {kind: 1.0}
    # Seeds 5000+: neither the build's studies (seed 0) nor the benchmark's (1000).
    images = [
        generate_study(np.random.default_rng([5000, i]), size=512, prevalence=prevalence).image
        for i in range(STUDIES_PER_FINDING)
    ]
    return [label_report(d.text) for d in drafter.draft_many(images, samples=0, max_new_tokens=160)]


@pytest.mark.parametrize("kind", list(COMMON))
def test_a_common_finding_in_the_image_is_in_the_draft(drafter, kind):
    observation = COMMON[kind]
    labels = _drafted_labels(drafter, kind)
    hits = sum(lab.get(observation) in (1, -1) for lab in labels)
    assert hits > STUDIES_PER_FINDING // 2, f"{observation} in {hits} of {STUDIES_PER_FINDING} drafts"


def test_a_normal_phantom_gets_a_normal_draft(drafter):
    labels = _drafted_labels(drafter, None)
    normal = sum(lab.get("No Finding") == 1 for lab in labels)
    assert normal > STUDIES_PER_FINDING // 2, f"no finding in only {normal} of {STUDIES_PER_FINDING} drafts"


def test_make_run_copies_the_shipped_starter_instead_of_building_it(drafter, tmp_path):
    # The shipped card must match the default plan, or `orapo serve` on a fresh clone would spend minutes building.
    from orapo_core.models.starter.build import ensure_starter, read_card

    out = ensure_starter(tmp_path / "models" / "starter", show_progress=False)
    assert read_card(out) == read_card(SHIPPED_DIR)
    assert (out / "model.safetensors").read_bytes() == (SHIPPED_DIR / "model.safetensors").read_bytes()


def test_the_shipped_starter_drafts_a_real_radiograph_and_a_png(drafter, tmp_path, data_dir, capsys):
    from PIL import Image

    from app.cli import main
    from orapo_core.data.phantom import generate_study
    from orapo_core.facts import label_report
    from tests.support.dicom import pydicom_data_file

    png = tmp_path / "phantom.png"
    Image.fromarray(np.round(generate_study(11, size=300).image * 255).astype(np.uint8)).save(png)
    for path in (pydicom_data_file("RG1_UNCI.dcm"), png):
        assert main(["draft", str(path), "--model", str(SHIPPED_DIR), "--samples", "0"]) == 0
        text = capsys.readouterr().out
        assert "FINDINGS:" in text and "IMPRESSION:" in text, text
        assert label_report(text), text  # a report FactS can read, not token soup


def test_the_starter_sees_other_pleural_findings_but_rarely_says_them(drafter):
    """The paper's setting, on purpose: other pleural findings (thickening, plaques) are in the state where the answer
    begins (prompt-state probe AUC 0.96, benchmarks/bench_probe.py) but the report training kept them scarce, so the
    starter under-reports them and rounds have something to learn. (Since 2026-12-07 the shipped starter does write
    a moderate or large pneumothorax: 142 of 168 clinic drafts; the starter before it wrote none.)"""
    from orapo_core.data.phantom import generate_study
    from orapo_core.facts import label_report

    images = [
        generate_study(np.random.default_rng([5100, i]), size=512, prevalence={"pleural_other": 1.0}).image
        for i in range(STUDIES_PER_FINDING)
    ]
    said = [
        label_report(d.text).get("Pleural Other") in (1, -1)
        for d in drafter.draft_many(images, samples=0, max_new_tokens=160)
    ]
    assert sum(said) < 0.2 * len(said), f"the starter already reports pleural other in {sum(said)} of {len(said)}"
