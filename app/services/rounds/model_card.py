"""A model card for every model that drafts: what it learned from, what it reads and states with the numbers
measured, and what it is for.

Built on demand from what the project already records, so it cannot drift from the model: the starter's build card
(`starter_card.json`: PhantomCXR films per finding), the versions' lineage (each round's clinic corrections, the
pairs assigned to it), and the held-out metrics a round stored with each version. A model folder without a build
card (a site's own checkpoint) is described as such, without invented numbers.

While the served model's base learned from synthetic films only (a PhantomCXR starter, whatever rounds were run on
it: a few hundred clinic corrections do not make a 6-million-parameter model a reader of real films), the page
shows `synthetic_banner`: its drafts of real radiographs are not clinical reads. A site's own base model (no build
card) shows no banner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.reading.served import ServedModel, resolve_path, served_model
from app.services.rounds.versions import heldout_metrics
from db import ModelVersionRepository, PairRepository
from orapo_core.facts.ontology import CHEXPERT_14
from orapo_core.models.starter.build import read_card

if TYPE_CHECKING:
    from db import Database
    from db.records import ModelVersionRecord
    from orapo_core.config import Settings

INTENDED_USE = (
    "Drafts a chest radiograph report for a radiologist to read, correct and sign. It is not a diagnosis: every "
    "sentence is the radiologist's to confirm, and a draft is never a report until signed."
)
SYNTHETIC_BANNER = (
    "The model drafting now learned from synthetic PhantomCXR films{corrections}: its drafts of real radiographs "
    "are not clinical reads. Read every sentence against the image."
)


@dataclass(frozen=True)
class FindingLine:
    finding: str
    report_films: int | None  # starter training films whose report states the finding (None: not recorded)
    vision_films: int | None  # films with the finding its image encoder learned from
    heldout_f1: float | None  # F1 on the version's held-out studies (None: not measured)
    heldout_support: int | None  # held-out studies with the finding


@dataclass(frozen=True)
class ModelCard:
    name: str
    version_id: int | None
    status: str  # "serving", or the version's status
    base: str  # the base model folder's name
    synthetic_base: bool  # its base learned from PhantomCXR films only (a starter build card)
    trained_on: list[str]
    corrections: int  # clinic corrections (clinician pairs) in this model's rounds, its ancestors' included
    rounds: list[int]
    heldout_reports: int | None
    heldout_macro_f1: float | None
    findings: list[FindingLine] = field(default_factory=list)
    intended_use: str = INTENDED_USE

    def markdown(self) -> str:
        """The card as the page shows it."""
        title = self.name + (f" (version {self.version_id})" if self.version_id is not None else "")
        lines = [
            f"### Model card: {title}",
            f"Status: **{self.status}**. Base weights: `{self.base}`.",
            "",
            "**Trained on**",
            *[f"- {line}" for line in self.trained_on],
            "",
            "**Intended use**",
            self.intended_use,
        ]
        if self.synthetic_base:
            lines.append(f"\n> {synthetic_text(self.corrections)}")
        lines += ["", "**Findings it reads and states**"]
        if self.heldout_reports:
            lines.append(
                f"Measured on {self.heldout_reports} held-out studies of its round: macro-F1 "
                f"{_num(self.heldout_macro_f1)}."
            )
        else:
            lines.append("No held-out numbers yet: they are measured when a round compares this model.")
        if self.findings:
            lines += [
                "",
                "| Finding | Training films stating it | Films its image encoder learned | "
                "Held-out F1 (studies with it) |",
                "|---|---|---|---|",
            ]
            for f in self.findings:
                held = "—" if f.heldout_f1 is None else f"{f.heldout_f1:.2f} ({f.heldout_support or 0})"
                lines.append(f"| {f.finding} | {_count(f.report_films)} | {_count(f.vision_films)} | {held} |")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version_id": self.version_id,
            "status": self.status,
            "base": self.base,
            "synthetic_base": self.synthetic_base,
            "trained_on": self.trained_on,
            "corrections": self.corrections,
            "rounds": self.rounds,
            "heldout_reports": self.heldout_reports,
            "heldout_macro_f1": self.heldout_macro_f1,
            "intended_use": self.intended_use,
            "findings": [vars(f) for f in self.findings],
        }


def synthetic_text(corrections: int) -> str:
    extra = f" and {corrections} clinic correction{'s' if corrections != 1 else ''}" if corrections else ""
    return SYNTHETIC_BANNER.format(corrections=extra)


def model_card(db: Database, settings: Settings, version_id: int | None = None) -> ModelCard:
    """The card of a version, or (None) of the model drafting now."""
    served = served_model(db, settings)
    if version_id is None and served.version_id is None:
        return _card(db, None, served.model_dir, served, served.name)
    versions = ModelVersionRepository(db)
    vid = served.version_id if version_id is None else version_id
    assert vid is not None
    version = versions.get(vid)  # OrapoError version_not_found
    base = resolve_path(settings, version.base_model_path) or Path(version.base_model_path)
    return _card(db, version, base, served, version.name)


def synthetic_banner(db: Database, settings: Settings) -> str | None:
    """The banner's sentence while the served model learned from synthetic films only, else None."""
    card = model_card(db, settings)
    return synthetic_text(card.corrections) if card.synthetic_base else None


def _lineage(db: Database, version: ModelVersionRecord | None) -> list[ModelVersionRecord]:
    chain, seen = [], set()
    repo = ModelVersionRepository(db)
    while version is not None and version.id not in seen:
        chain.append(version)
        seen.add(version.id)
        version = repo.get(version.parent_id) if version.parent_id is not None else None
    return chain


def _card(db: Database, version: ModelVersionRecord | None, base: Path, served: ServedModel, name: str) -> ModelCard:
    starter = read_card(base) if base.is_dir() else None
    chain = _lineage(db, version)
    rounds = sorted({v.round_id for v in chain if v.round_id is not None})
    pairs = PairRepository(db)
    per_round = {r: sum(p.correction_id is not None for p in pairs.list(round_id=r)) for r in rounds}  # one query each
    corrections = sum(per_round.values())
    trained_on = []
    if starter is not None:
        plan = starter.get("plan") or {}
        n = plan.get("n_train") or sum((starter.get("train_findings") or {}).values())
        trained_on.append(
            f"{n} synthetic PhantomCXR studies (films and reference reports made by the project), "
            f"built with `{starter.get('command', 'orapo starter build')}`."
        )
    else:
        trained_on.append(f"Not recorded: `{base.name}` carries no build card (a site's own checkpoint).")
    for r, n in per_round.items():
        trained_on.append(f"Round {r}: {n} clinic correction{'s' if n != 1 else ''} (signed reports as oracle pairs).")
    metrics = heldout_metrics(version) if version is not None else None
    findings = []
    for finding in CHEXPERT_14[1:]:  # "No Finding" is no finding to read
        key = finding.lower().replace(" ", "_")  # the build card's names
        report = (starter or {}).get("train_findings", {}).get(key)
        vision = (starter or {}).get("vision_findings", {}).get(key)
        f1 = metrics.f1_per_class.get(finding) if metrics else None
        support = metrics.support_per_class.get(finding) if metrics else None
        if report is None and vision is None and f1 is None:
            continue
        findings.append(FindingLine(finding, report, vision, f1, support))
    if version is None or (served.version_id is not None and version.id == served.version_id):
        status = "serving"
    else:
        status = version.status
    return ModelCard(
        name=name,
        version_id=version.id if version else None,
        status=status,
        base=base.name,
        synthetic_base=starter is not None,
        trained_on=trained_on,
        corrections=corrections,
        rounds=rounds,
        heldout_reports=metrics.n_reports if metrics else None,
        heldout_macro_f1=metrics.macro_f1_14 if metrics else None,
        findings=findings,
    )


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _count(value: int | None) -> str:
    return "—" if value is None else str(value)
