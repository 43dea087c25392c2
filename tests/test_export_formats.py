"""`orapo export`: pairs read back by `datasets` and by TRL's own data code; FHIR read back by fhir.resources."""

from __future__ import annotations

import base64
import json

import pytest

pytest.importorskip("trl")

from app.cli import main  # noqa: E402
from tests.support.rounds import seed_study


@pytest.fixture
def seeded(data_dir, phantom):
    """The CLI's own database (ORAPO_DATA_DIR): two edited signed studies, one accepted unchanged, one held out,
    one with a draft only."""
    from app.runtime import open_database
    from db import DraftRepository, ModelVersionRepository, StudyRepository, UserRepository
    from orapo_core.config import Settings

    settings = Settings()
    db = open_database(settings)
    rad = UserRepository(db).create("rita", "rita-pass-1")
    version = ModelVersionRepository(db).create("starter-v1", base_model_path="models/starter")
    edited = [seed_study(db, settings, r, author=rad)[0] for r in phantom[:2]]
    unchanged = seed_study(db, settings, phantom[2], author=rad, edited=False)[0]
    held = seed_study(db, settings, phantom[3], author=rad, split="holdout")[0]
    draft_only = StudyRepository(db).create("draft-only-uid", "ANON-D")
    DraftRepository(db).create(
        draft_only.id,
        model_name="starter",
        prompt="p",
        text="Findings: Clear.\nImpression: Normal.",
        model_version_id=version.id,
    )
    return type(
        "Seeded",
        (),
        dict(
            db=db,
            settings=settings,
            edited=edited,
            unchanged=unchanged,
            held=held,
            draft_only=draft_only,
            version=version,
        ),
    )


def test_trl_dpo_export_feeds_trls_vision_preference_collator(seeded, tmp_path, tiny_model, capsys):
    from datasets import load_from_disk
    from trl.data_utils import is_conversational
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from orapo_core.models.compat import load_processor

    out = tmp_path / "dpo"
    assert main(["export", "pairs", "--format", "trl-dpo", str(out)]) == 0, capsys.readouterr().err
    ds = load_from_disk(str(out))
    assert len(ds) == 2 and set(ds.column_names) >= {"prompt", "chosen", "rejected", "images"}
    row = ds[0]
    assert is_conversational(row) and row["chosen"][0]["role"] == "assistant"
    assert row["images"][0].size == (64, 64)  # embedded bytes, decoded to PIL
    assert sorted(ds["study_id"]) == sorted(s.id for s in seeded.edited)  # no held-out, no unchanged study

    from transformers import AutoConfig

    processor = load_processor(tiny_model, AutoConfig.from_pretrained(tiny_model))
    batch = DataCollatorForVisionPreference(processor)([ds[0], ds[1]])
    assert batch["input_ids"].shape[0] == 4 and "pixel_values" in batch and batch["completion_mask"].sum() > 0

    assert main(["export", "pairs", "--format", "trl-dpo", str(out)]) == 2  # never overwrites
    assert "export_exists" in capsys.readouterr().err


def test_trl_grpo_export_matches_the_training_dataset(seeded, tmp_path, capsys):
    from datasets import load_from_disk
    from trl.data_utils import is_conversational

    from orapo_core.train.dataset import build_training_dataset

    out = tmp_path / "grpo"
    assert main(["export", "pairs", "--format", "trl-grpo", str(out)]) == 0, capsys.readouterr().err
    ds = load_from_disk(str(out))
    reference = build_training_dataset(
        [
            {
                "study_id": "x",
                "image": str(next(seeded.settings.storage_dir.rglob("*.png"))),
                "labels": {},
                "clinician_chosen": "a",
                "clinician_rejected": "b",
            }
        ]
    )
    assert ds.features == reference.features  # the same columns and types `orapo train` builds
    assert sorted(map(int, ds["study_id"])) == sorted([*(s.id for s in seeded.edited), seeded.unchanged.id])
    row = ds[0]
    assert is_conversational(row) and row["image"].size == (64, 64)
    assert json.loads(row["labels"]) and row["oracle_report"].startswith("Findings:")
    unchanged = next(r for r in ds if int(r["study_id"]) == seeded.unchanged.id)
    assert unchanged["clinician_rejected"] == ""  # accepted as drafted: no clinician pair


def test_trl_grpo_rows_take_each_clinician_pair_by_its_report_not_by_its_words(data_dir, phantom, tmp_path, capsys):
    """A `trl-grpo` row's clinician pair is the one stored with the signed report (its correction id), as a round's:
    two studies signed in the same words each keep the draft they replaced; a report signed again in the same words,
    this time as the draft stood, has no pair although its earlier version had one; an edited report stored without
    its pair (a restored or imported one) has the draft it was made from."""
    import shutil
    from pathlib import Path

    from datasets import load_from_disk

    from app.runtime import open_database
    from db import CorrectionRepository, DraftRepository, PairRepository, StudyRepository, UserRepository
    from orapo_core.config import Settings
    from orapo_core.models.prompt import REPORT_PROMPT
    from tests.support.rounds import uid_with_split

    settings = Settings()
    db = open_database(settings)
    rita = UserRepository(db).create("rita", "rita-pass-1")
    studies, drafts, corrections = StudyRepository(db), DraftRepository(db), CorrectionRepository(db)
    same_words = "Findings: Small left pleural effusion.\nImpression: Small left pleural effusion."

    def drafted(tag, text):
        study = studies.create(uid_with_split(f"words-{tag}", "train"), f"ANON-{tag}")
        rel = Path(f"seed/{study.id}/frontal.png")
        (settings.storage_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(phantom[0].image_paths[0], settings.storage_dir / rel)
        studies.add_image(study.id, display_path=rel.as_posix(), width=64, height=64, source_format="png")
        return study, drafts.create(study.id, model_name="tiny", prompt=REPORT_PROMPT, text=text)

    def edited(study, draft, *, signed=True, pair=True):
        report = corrections.create(study.id, author_id=rita.id, text=same_words, draft_id=draft.id, signed=signed)
        if pair:
            PairRepository(db).add(
                study.id,
                prompt=draft.prompt,
                chosen=same_words,
                rejected=draft.text,
                source="clinician_edit",
                correction_id=report.id,
            )
        return report

    first, first_draft = drafted("first", "Findings: Clear lungs.\nImpression: Normal.")
    second, second_draft = drafted("second", "Findings: Heart normal in size.\nImpression: No acute process.")
    edited(first, first_draft)
    edited(second, second_draft)
    resigned, resigned_draft = drafted("resigned", "Findings: Left base opacity.\nImpression: Atelectasis.")
    version_1 = edited(resigned, resigned_draft, signed=False)
    corrections.amend(version_1.id, author_id=rita.id, text=same_words, accepted_unchanged=True, signed=True)
    unpaired, unpaired_draft = drafted("unpaired", "Findings: No effusion.\nImpression: Normal.")
    edited(unpaired, unpaired_draft, pair=False)

    out = tmp_path / "grpo"
    assert main(["export", "pairs", "--format", "trl-grpo", str(out)]) == 0, capsys.readouterr().err
    rows = {int(r["study_id"]): r for r in load_from_disk(str(out))}
    assert {s: r["clinician_rejected"] for s, r in rows.items()} == {
        first.id: first_draft.text,
        second.id: second_draft.text,
        resigned.id: "",
        unpaired.id: unpaired_draft.text,
    }
    assert {r["clinician_chosen"] for s, r in rows.items() if s != resigned.id} == {same_words}
    assert rows[resigned.id]["clinician_chosen"] == ""


def test_fhir_export_reads_back_as_r4_diagnostic_reports(seeded, tmp_path, capsys):
    from fhir.resources.R4B.bundle import Bundle

    out = tmp_path / "fhir"
    assert main(["export", "fhir", "--all", str(out)]) == 0, capsys.readouterr().err
    files = sorted(out.glob("study-*.json"))
    assert len(files) == 5
    study = seeded.edited[0]
    bundle = Bundle.model_validate_json((out / f"study-{study.id}.json").read_text())
    reports = [e.resource for e in bundle.entry if e.resource.get_resource_type() == "DiagnosticReport"]
    provenance = [e.resource for e in bundle.entry if e.resource.get_resource_type() == "Provenance"]
    assert [r.status for r in reports] == ["preliminary", "final"] and len(provenance) == 2
    final = reports[1]
    assert final.code.coding[0].system == "http://loinc.org" and final.code.coding[0].code == "18748-4"
    text = final.presentedForm[0].data.decode()  # fhir.resources decodes base64Binary to bytes
    raw = json.loads((out / f"study-{study.id}.json").read_text())
    assert base64.b64decode(raw["entry"][2]["resource"]["presentedForm"][0]["data"]).decode() == text
    assert text.startswith("Findings:") and final.conclusion and final.conclusion in text
    assert provenance[0].target[0].reference == bundle.entry[0].fullUrl
    assert any("rita" in a.who.display for a in provenance[1].agent)

    draft_only = Bundle.model_validate_json((out / f"study-{seeded.draft_only.id}.json").read_text())
    (report,), (prov,) = (
        [e.resource for e in draft_only.entry if e.resource.get_resource_type() == t]
        for t in ("DiagnosticReport", "Provenance")
    )
    assert report.status == "preliminary" and f"version {seeded.version.id} (starter-v1)" in prov.agent[0].who.display

    assert main(["export", "fhir", str(study.id), str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / f"study-{study.id}.json").is_file()
    assert main(["export", "fhir", str(tmp_path / "x")]) == 2 and "study_or_all" in capsys.readouterr().err


def test_fhir_marks_the_sentences_the_finding_check_added(data_dir, tmp_path):
    """A sentence the version's finding check put in the draft (read on the image, not written by the model) is an
    extension of the preliminary report, of the final one where the reader kept it, and the check is named in the
    draft's Provenance."""
    from fhir.resources.R4B.bundle import Bundle

    from app.runtime import open_database
    from app.services.operations.export_fhir import ADDED_BY_CHECK, fhir_bundle
    from db import CorrectionRepository, DraftRepository, ModelVersionRepository, StudyRepository, UserRepository
    from orapo_core.config import Settings

    db = open_database(Settings())
    rita = UserRepository(db).create("rita", "rita-pass-1")
    version = ModelVersionRepository(db).create("round-2", base_model_path="models/starter")
    kept, dropped = "Small left pneumothorax.", "Healing right rib fracture."
    study = StudyRepository(db).create("checked-uid", "ANON-C")
    draft = DraftRepository(db).create(
        study.id,
        model_name="round-2",
        prompt="p",
        model_version_id=version.id,
        text=f"Findings: Heart is normal. {kept} {dropped}\nImpression: {kept}",
        facts={"flagged": [], "withheld": [], "added": [kept, dropped]},
    )
    CorrectionRepository(db).create(
        study.id,
        author_id=rita.id,
        draft_id=draft.id,
        signed=True,
        text=f"Findings: Heart is normal.  {kept}\nImpression: {kept}",
    )
    bundle = fhir_bundle(db, study.id)
    Bundle.model_validate(bundle)  # still valid R4(B)
    preliminary, provenance, final, _ = (e["resource"] for e in bundle["entry"])
    assert preliminary["extension"] == [
        {"url": ADDED_BY_CHECK, "valueString": kept},
        {"url": ADDED_BY_CHECK, "valueString": dropped},
    ]
    assert final["status"] == "final" and final["extension"] == [{"url": ADDED_BY_CHECK, "valueString": kept}]
    assert "finding-check" in ADDED_BY_CHECK
    authors = [a["who"]["display"] for a in provenance["agent"] if a["type"]["coding"][0]["code"] == "author"]
    assert (
        authors[1].startswith("Automatic finding check of OraPO model version")
        and "not written by the model" in authors[1]
    )
    # a draft without additions carries no extension and names no check
    plain = StudyRepository(db).create("plain-uid", "ANON-P")
    DraftRepository(db).create(plain.id, model_name="round-2", prompt="p", text="Findings: Clear.")
    (report, prov) = (e["resource"] for e in fhir_bundle(db, plain.id)["entry"])
    assert "extension" not in report and len(prov["agent"]) == 1
