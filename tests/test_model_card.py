"""Issue 41 §5: every model that drafts has a card (what it learned from, what it reads and states with measured
numbers, what it is for), a draft's status names the version that wrote it, and a synthetic-only base is said so."""

from __future__ import annotations

import pytest


@pytest.fixture()
def env(tmp_path):
    from tests.support.app import make_env

    return make_env(tmp_path)


def test_the_starter_served_at_first_start_has_a_card_and_a_banner(env):
    from app.services.rounds.model_card import model_card, synthetic_banner

    settings, db = env
    card = model_card(db, settings)
    assert card.status == "serving" and card.version_id is None and card.synthetic_base
    assert "synthetic PhantomCXR" in card.trained_on[0] and card.corrections == 0 and card.rounds == []
    from orapo_core.models.starter.build import SHIPPED_DIR, read_card

    films = read_card(SHIPPED_DIR)["train_findings"]["pneumothorax"]  # the shipped starter_card.json's (46 since 12-07)
    by_finding = {f.finding: f for f in card.findings}
    assert by_finding["Pneumothorax"].report_films == films > 0
    assert by_finding["Pneumothorax"].heldout_f1 is None  # nothing measured in this clinic yet
    text = card.markdown()
    assert "Intended use" in text and "not clinical reads" in text and f"| Pneumothorax | {films} |" in text
    banner = synthetic_banner(db, settings)
    assert banner is not None and "synthetic PhantomCXR films:" in banner


def test_a_round_version_counts_its_lineage_corrections_and_shows_held_out_numbers(env, tmp_path):
    from app.services.rounds.model_card import model_card, synthetic_banner
    from db import ModelVersionRepository, PairRepository, RoundRepository, UserRepository
    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import write_dataset
    from orapo_core.models.loading import resolve_model_dir
    from tests.support.rounds import seed_study

    settings, db = env
    write_dataset(tmp_path / "phantom", 3, seed=5, size=64)
    rita = UserRepository(db).get_by_username("rita")
    for record in load_dataset(tmp_path / "phantom"):
        seed_study(db, settings, record, author=rita)
    first, second = RoundRepository(db).create(trigger="manual"), RoundRepository(db).create(trigger="manual")
    pairs = PairRepository(db).list()
    assert len(pairs) == 3
    PairRepository(db).assign_to_round([pairs[0].id, pairs[1].id], first.id)
    PairRepository(db).assign_to_round([pairs[2].id], second.id)
    PairRepository(db).add(
        pairs[2].study_id, prompt="p", chosen="c", rejected="r", source="oracle_step"
    )  # not a reader's

    starter = str(resolve_model_dir(settings=settings))
    versions = ModelVersionRepository(db)
    base = versions.create("base-starter", base_model_path=starter)
    one = versions.create("round-1", base_model_path=starter, parent_id=base.id, round_id=first.id)
    heldout = {
        "n_reports": 40,
        "macro_f1_14": 0.45,
        "f1_per_class": {"Pneumothorax": 0.62},
        "support_per_class": {"Pneumothorax": 13},
    }
    two = versions.create(
        "round-2", base_model_path=starter, parent_id=one.id, round_id=second.id, metrics={"heldout": heldout}
    )
    versions.promote(two.id)

    card = model_card(db, settings)
    assert (card.name, card.version_id, card.status) == ("round-2", two.id, "serving")
    assert card.rounds == [first.id, second.id] and card.corrections == 3
    pneumothorax = {f.finding: f for f in card.findings}["Pneumothorax"]
    assert (pneumothorax.heldout_f1, pneumothorax.heldout_support) == (0.62, 13)
    assert "Measured on 40 held-out studies" in card.markdown() and "| 0.62 (13) |" in card.markdown()
    assert "3 clinic corrections" in synthetic_banner(db, settings)

    older = model_card(db, settings, one.id)  # a version not serving: its own lineage only
    assert older.status == "candidate" and older.corrections == 2 and older.heldout_reports is None


def test_a_sites_own_base_model_has_no_invented_numbers_and_no_banner(env, tmp_path):
    from app.services.rounds.model_card import model_card, synthetic_banner
    from db import ModelVersionRepository

    settings, db = env
    site = tmp_path / "site-model"
    site.mkdir()
    versions = ModelVersionRepository(db)
    v = versions.create("site-base", base_model_path=str(site))
    versions.promote(v.id)
    card = model_card(db, settings)
    assert not card.synthetic_base and card.findings == [] and "carries no build card" in card.trained_on[0]
    assert synthetic_banner(db, settings) is None


def test_a_drafts_status_names_the_version_that_wrote_it_not_the_base_folder():
    """After round-1 was promoted, the status said 'Draft 11 by starter' (the base folder's name)."""
    from datetime import datetime

    from app.services.reading.served import drafted_by
    from db.records import DraftRecord

    def draft(sampling, version_id):
        return DraftRecord(
            id=11,
            study_id=1,
            model_version_id=version_id,
            model_name="starter",
            prompt="p",
            sampling=sampling,
            text="t",
            facts={},
            sentence_scores=[],
            latency_ms=5,
            created_by=None,
            created_at=datetime(2026, 1, 1),
        )

    assert drafted_by(draft({"model_version": "round-1"}, 3)) == "round-1 (version 3)"
    assert drafted_by(draft({"model_version": "starter"}, None)) == "starter"
    assert drafted_by(draft({}, None)) == "starter"
