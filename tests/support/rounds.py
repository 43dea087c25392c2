"""Seeding studies as the app stores them, and the recipe a test round trains with (seconds on a CPU)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "orapo_core" / "train" / "recipes" / "smoke-cpu.yaml")
FAST_TRAINING = {
    "max_steps": 2,
    "max_completion_length": 8,
    "per_device_train_batch_size": 4,
    "num_generations": 2,
    "use_peft": True,
    "lora_r": 4,
    "lora_alpha": 8,
    "lora_target_modules": ["q_proj", "v_proj"],
}


def uid_with_split(prefix: str, split: str) -> str:
    from db.repositories import split_for

    for k in range(10_000):
        uid = f"{prefix}-{k}"
        if split_for(uid) == split:
            return uid
    raise AssertionError("no uid found")


def seed_study(
    db, settings, record, *, author, split: str = "train", tag: str = "", edited: bool = True, signed: bool = True
):
    """One study as the app would have stored it: image in storage, a model draft, the clinician's report and pair."""
    import shutil

    from db import CorrectionRepository, DraftRepository, PairRepository, StudyRepository
    from orapo_core.models.prompt import REPORT_PROMPT

    studies = StudyRepository(db)
    study = studies.create(uid_with_split(f"{record.study_id}{tag}", split), f"ANON-{record.study_id}{tag}")
    assert study.split == split
    rel = Path(f"seed/{study.id}/frontal.png")
    (settings.storage_dir / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(record.image_paths[0], settings.storage_dir / rel)
    studies.add_image(study.id, display_path=rel.as_posix(), width=64, height=64, source_format="png")
    draft = DraftRepository(db).create(
        study.id,
        model_name="tiny",
        prompt=REPORT_PROMPT,
        text="Findings: The lungs are clear.\nImpression: No acute process.",
    )
    text = f"Findings: {record.findings}\nImpression: {record.impression}" if edited else draft.text
    correction = CorrectionRepository(db).create(
        study.id, author_id=author.id, text=text, draft_id=draft.id, signed=signed
    )
    if edited and split == "train":
        PairRepository(db).add(
            study.id,
            prompt=draft.prompt,
            chosen=text,
            rejected=draft.text,
            source="clinician_edit",
            correction_id=correction.id,
        )
    return study, correction
