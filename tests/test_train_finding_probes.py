"""The rounds' finding probes: their targets, and the loss they add to OraPO's on a tiny random VLM."""

from __future__ import annotations

import pytest

from tests.support.training import four_studies, make_trainer

torch = pytest.importorskip("torch")
pytest.importorskip("trl")


def test_targets_are_the_oracle_reports_facts_with_hedges_counted_present():
    from orapo_core.facts.ontology import CHEXPERT_14
    from orapo_core.train.finding_probes import finding_targets

    said = dict(
        zip(
            CHEXPERT_14,
            finding_targets(
                "There is a moderate right pneumothorax. No pleural effusion. Possible pneumonia at the left base."
            ),
        )
    )
    assert said["Pneumothorax"] == 1.0 and said["Pneumonia"] == 1.0
    assert said["Pleural Effusion"] == 0.0 and said["Cardiomegaly"] == 0.0
    empty = dict(zip(CHEXPERT_14, finding_targets("")))
    assert empty.pop("No Finding") == 1.0 and set(empty.values()) == {0.0}  # FactS: a report that states nothing


def test_a_negative_weight_is_refused_with_the_settings_name():
    from orapo_core.train.config import OraPOConfig

    with pytest.raises(ValueError, match="finding_probe_weight"):
        OraPOConfig(output_dir="unused", finding_probe_weight=-1.0, report_to="none")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return four_studies(tmp_path_factory.mktemp("images"))


def test_the_probes_add_their_weighted_loss_to_the_same_forward_and_train_through_the_merger(
    tiny_model, dataset, tmp_path
):
    from orapo_core.train.finding_probes import finding_targets

    trainer = make_trainer(tiny_model, dataset, tmp_path / "run", finding_probe_weight=2.0)
    assert trainer.finding_probes is not None
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [dataset[i] for i in (0, 0, 1, 1)]
    batch = trainer._generate_and_score_completions(rows)
    expected = torch.tensor([finding_targets(trainer.oracle_text(r)) for r in rows])
    assert torch.equal(batch["orapo_finding_targets"], expected)
    assert expected[2].sum() > 0  # study 1's oracle states an effusion: the targets are not all zero

    merger = [p for n, p in trainer.model.named_parameters() if "merger" in n and p.requires_grad]
    assert merger, "the tiny model's merger has no trainable parameter to check"
    with_probes = trainer._compute_loss(trainer.model, batch)
    logged = trainer._metrics["train"]
    parts = [logged["orapo/finding_probe_visual_loss"][-1], logged["orapo/finding_probe_prompt_loss"][-1]]
    trainer.model.zero_grad()
    with_probes.backward()
    probe_grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in merger]

    probes, trainer.finding_probes = trainer.finding_probes, None
    without = trainer._compute_loss(trainer.model, batch)
    assert (with_probes - without).item() == pytest.approx(2.0 * sum(parts) / 2, rel=1e-4)
    trainer.model.zero_grad()
    without.backward()
    plain_grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in merger]
    assert any(not torch.allclose(a, b) for a, b in zip(probe_grads, plain_grads, strict=True))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in probes.parameters())


@pytest.mark.slow
def test_the_probes_own_layers_join_the_optimizer_and_a_run_logs_their_losses(tiny_model, dataset, tmp_path):
    import json

    trainer = make_trainer(tiny_model, dataset, tmp_path / "run", finding_probe_weight=0.5, finding_probe_lr=1e-2)
    before = [p.detach().clone() for p in trainer.finding_probes.parameters()]
    trainer.train()
    groups = trainer.optimizer.param_groups
    assert any(
        g["initial_lr"] == pytest.approx(1e-2)
        and any(p is q for p in g["params"] for q in trainer.finding_probes.parameters())
        for g in groups
    )
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.finding_probes.parameters(), strict=True))
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("orapo/finding_probe_visual_loss" in line for line in lines) == 2  # max_steps
