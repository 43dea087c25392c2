"""OraPOTrainer on a tiny random VLM: the combined loss by hand, and a two-step training smoke test."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.training import K, four_studies, make_trainer

torch = pytest.importorskip("torch")
pytest.importorskip("trl")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return four_studies(tmp_path_factory.mktemp("images"))


def _answer_logps(model, batch, row: int, ids: torch.Tensor) -> float:
    """log π(ids | prompt, image) for one row by a plain forward, outside TRL's helpers."""
    prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()]
    grid = batch["image_grid_thw"]
    per_image = int(grid[0].prod())
    pixels = batch["pixel_values"][row * per_image : (row + 1) * per_image]
    input_ids = torch.cat([prompt, ids]).unsqueeze(0)
    mm_types = batch["mm_token_type_ids"][row][: batch["prompt_ids"].size(1)][batch["prompt_mask"][row].bool()]
    mm_types = torch.cat([mm_types, mm_types.new_zeros(len(ids))]).unsqueeze(0)
    with torch.no_grad():
        logits = model(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            pixel_values=pixels,
            image_grid_thw=grid[row : row + 1],
            mm_token_type_ids=mm_types,
        ).logits
    logps = torch.log_softmax(logits[0, len(prompt) - 1 : -1].float(), dim=-1)
    return logps.gather(1, ids.unsqueeze(1)).sum().item()


def _count_forward_rows(trainer) -> list[int]:
    """Record the number of rows of every forward the trainer makes through TRL's helper from now on."""
    calls = []
    original = trainer._get_per_token_logps_and_entropies

    def counting(model, input_ids, *args, **kwargs):
        calls.append(input_ids.size(0))
        return original(model, input_ids, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counting
    return calls


def _count_model_rows(model) -> list[int]:
    """Record the number of rows of every call of ``model`` from now on (TRL's helper and the shared-prompt path)."""
    calls = []
    original = model.forward

    def counting(*args, input_ids=None, **kwargs):
        calls.append(input_ids.size(0))
        return original(*args, input_ids=input_ids, **kwargs)

    model.forward = counting
    return calls


def test_combined_loss_matches_a_hand_computation(tiny_model, dataset, tmp_path):
    import math

    trainer = make_trainer(tiny_model, dataset, tmp_path / "run", beta=0.0, loss_type="grpo")
    with torch.no_grad():  # move the policy away from the frozen reference, so Δ ≠ 0
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); this test calls the loss directly
    rows = [dataset[i] for i in (0, 0, 1, 1)]  # two studies, K=2 rollouts each, as TRL's sampler lays them out
    batch = trainer._generate_and_score_completions(rows)
    mask = batch["completion_mask"].bool()
    rewards = [float(int(ids[m].sum()) % 2) for ids, m in zip(batch["completion_ids"], mask)]

    miner_rates = []
    expected_adv, coefs, weights = [], [], []
    for g in range(2):
        r = rewards[g * K : (g + 1) * K]
        mean, std = sum(r) / K, math.sqrt(sum((x - sum(r) / K) ** 2 for x in r) / (K - 1))
        z = sum(1 for x in r if x == 0) / K
        failed = [j for j in range(K) if r[j] == 0]
        w = 0.05 + 0.10 * z**2 if failed else 0.0  # study s1 has an oracle from the reference report too
        miner_rates.append(z)
        weights.append(w)
        expected_adv += [(x - mean) / (std + 1e-4) * (1 - w) for x in r]
        coefs += [w / len(failed) if j in failed else 0.0 for j in range(K)]
    assert batch["advantages"].tolist() == pytest.approx(expected_adv, abs=1e-5)
    assert batch["orapo_coef"].tolist() == pytest.approx(coefs)

    oracles = [rows[i]["oracle_report"] for i in range(2 * K)]
    dpo_rows = []
    for row in range(2 * K):
        if coefs[row] == 0:
            continue
        eos = trainer.eos_token_ids[-1]
        chosen = torch.tensor(trainer._tokenizer(oracles[row], add_special_tokens=False)["input_ids"] + [eos])[:6]
        rejected = batch["completion_ids"][row][mask[row]]
        ref_c = _answer_logps(trainer.ref_model, batch, row, chosen)
        ref_r = _answer_logps(trainer.ref_model, batch, row, rejected)
        assert batch["orapo_ref_chosen_logps"][row].item() == pytest.approx(ref_c, abs=1e-4)
        assert batch["orapo_ref_rejected_logps"][row].item() == pytest.approx(ref_r, abs=1e-4)
        pol_c = _answer_logps(trainer.model, batch, row, chosen)
        pol_r = _answer_logps(trainer.model, batch, row, rejected)
        margin = (pol_c - ref_c) - (pol_r - ref_r)
        dpo_rows.append(coefs[row] * math.log1p(math.exp(-0.5 * margin)))
    assert dpo_rows, "the parity reward should fail at least one rollout with seed 0"
    # beta = 0 and on-policy ratios of 1: TRL's 'grpo' loss is −mean(advantage); the oracle term is (1/B)·Σ w_i·L_DPO,i
    expected = -sum(expected_adv) / len(expected_adv) + sum(dpo_rows) / 2
    forwards = _count_forward_rows(trainer)
    loss = trainer._compute_loss(trainer.model, batch)
    assert loss.item() == pytest.approx(expected, abs=1e-4)
    # TRL's GRPO forward, then one oracle forward per study with a pair; the rejected rollouts' log-probs are TRL's
    studies_with_pairs = sum(1 for g in range(2) if any(c > 0 for c in coefs[g * K : (g + 1) * K]))
    assert sum(1 for c in coefs if c > 0) > studies_with_pairs  # a study with two failed rollouts: its oracle is shared
    assert forwards == [2 * K, studies_with_pairs]
    forwards.clear()
    unpaired = dict(batch, orapo_coef=torch.zeros_like(batch["orapo_coef"]))
    trainer._compute_loss(trainer.model, unpaired)
    assert forwards == [2 * K]  # no pair in the micro-batch: no oracle forward at all
    assert trainer._metrics["train"]["orapo/zero_reward_frac"][-1] == pytest.approx(sum(miner_rates) / 2)
    assert trainer._metrics["train"]["orapo/all_zero_group_frac"][-1] == sum(z == 1.0 for z in miner_rates) / 2


def test_with_a_kl_term_the_reference_log_probs_of_rejected_rollouts_are_trls_own(tiny_model, dataset, tmp_path):
    trainer = make_trainer(tiny_model, dataset, tmp_path / "run", beta=0.04)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.model.train()
    forwards = _count_forward_rows(trainer)
    reference = _count_model_rows(trainer.ref_model)
    batch = trainer._generate_and_score_completions([dataset[i] for i in (0, 0, 1, 1)])
    reference = list(reference)  # the calls of the generation step, before this test's own forwards below
    paired = [r for r in range(2 * K) if batch["orapo_coef"][r] > 0]
    assert paired and "ref_per_token_logps" in batch
    for row in paired:
        rejected = batch["completion_ids"][row][batch["completion_mask"][row].bool()]
        assert batch["orapo_ref_rejected_logps"][row].item() == pytest.approx(
            _answer_logps(trainer.ref_model, batch, row, rejected), abs=1e-4
        )
    # TRL's reference forward over all rows; then each study's prompt once and its oracle after it (the shared-prompt
    # path); none for the rejected rollouts
    studies = len({row // K for row in paired})
    assert forwards == [2 * K]
    assert reference == [2 * K, studies, studies]


@pytest.mark.slow
def test_two_training_steps_change_parameters_and_write_metrics_jsonl(tiny_model, dataset, tmp_path):
    trainer = make_trainer(tiny_model, dataset, tmp_path / "run", max_rejected_per_group=1)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    started = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - started
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "two optimizer steps left every parameter unchanged"
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "orapo/zero_reward_frac" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for key in (
        "orapo/zero_reward_frac",
        "orapo/all_zero_group_frac",
        "orapo/dpo_weight",
        "orapo/pairs",
        "orapo/grpo_loss",
        "reward",
        "reward_std",
        "orapo/reward_mean",
        "orapo/reward_std",
    ):
        assert all(key in line for line in steps), key
    if any(line["orapo/pairs"] > 0 for line in steps):
        assert any("orapo/dpo_loss" in line and line["orapo/oracle_logp"] < 0 for line in steps)
    assert all(line["orapo/pairs"] <= 2 for line in steps)  # max_rejected_per_group=1, two groups per step
    assert elapsed < 60


def test_clinician_pair_rides_on_a_free_row(tiny_model, dataset, tmp_path):
    from orapo_core.train.dataset import build_training_dataset

    image = dataset[0]["image"]
    clinician = build_training_dataset(
        [
            {
                "study_id": "c1",
                "image": image,
                "labels": {},
                "reference_report": "Findings: The lungs are clear.",
                "oracle_report": "Findings: No pleural effusion.",
                "clinician_chosen": "Findings: No pleural effusion.",
                "clinician_rejected": "Findings: Small pleural effusion.",
            }
        ]
    )
    trainer = make_trainer(
        tiny_model,
        clinician,
        tmp_path / "run",
        use_clinician_pairs=True,
        zero_reward_threshold=0.5,
        max_rejected_per_group=1,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([clinician[0]] * K)
    draft = trainer._tokenizer("Findings: Small pleural effusion.", add_special_tokens=False)["input_ids"]
    draft = (draft + [trainer.eos_token_ids[-1]])[:6]
    rejected = [ids[m.bool()].tolist() for ids, m in zip(batch["orapo_rejected_ids"], batch["orapo_rejected_mask"])]
    assert draft in rejected  # the clinician's own draft is a rejected answer of this study
    assert (batch["orapo_coef"] > 0).sum().item() == len([r for r in rejected if r])
    assert torch.isfinite(trainer._compute_loss(trainer.model, batch))


def test_oracle_nll_adds_the_oracles_mean_token_nll_to_each_paired_rows_loss(tiny_model, dataset, tmp_path):
    """`oracle_nll_weight` α: each paired row's loss is DPO's plus α times the oracle's mean per-token NLL (RPO)."""
    plain = make_trainer(tiny_model, dataset, tmp_path / "plain", beta=0.0, loss_type="grpo")
    with_nll = make_trainer(tiny_model, dataset, tmp_path / "nll", beta=0.0, loss_type="grpo", oracle_nll_weight=0.7)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in plain.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with_nll.model.load_state_dict(plain.model.state_dict())
    for trainer in (plain, with_nll):
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
    rows = [dataset[i] for i in (0, 0, 1, 1)]
    torch.manual_seed(1)
    batch = plain._generate_and_score_completions(rows)
    paired = torch.nonzero(batch["orapo_coef"] > 0).flatten()
    assert paired.numel() > 0
    selected = plain._select_rows(batch, paired)
    dpo, logp = plain.pair_losses(plain.model, batch, paired, selected)
    rpo, logp_nll = with_nll.pair_losses(with_nll.model, batch, paired, with_nll._select_rows(batch, paired))
    assert logp_nll.tolist() == pytest.approx(logp.tolist(), abs=1e-5)
    assert (logp < 0).all()
    assert rpo.tolist() == pytest.approx((dpo - 0.7 * logp).tolist(), abs=1e-5)
    assert rpo.requires_grad


# One paired row per study: the clinician's pair, and at most one failed rollout.
PAIR_SETTINGS = dict(
    beta=0.0, loss_type="grpo", use_clinician_pairs=True, zero_reward_threshold=0.5, max_rejected_per_group=1
)


def _clinician_set(dataset, oracle: str):
    """One study whose clinician signed `oracle` over the draft "Findings: No pleural effusion."."""
    from orapo_core.train.dataset import build_training_dataset

    study = {
        "study_id": "c1",
        "image": dataset[0]["image"],
        "labels": {},
        "reference_report": "Findings: The lungs are clear.",
        "oracle_report": oracle,
        "clinician_chosen": oracle,
        "clinician_rejected": "Findings: No pleural effusion.",
    }
    return build_training_dataset([study])


def test_a_focused_oracle_nll_averages_only_the_oracles_tokens_the_rejected_answer_did_not_write(
    tiny_model, dataset, tmp_path
):
    """`oracle_nll_focus="differing"`: each paired row adds α times the mean NLL of the oracle's tokens outside the
    blocks it shares with that row's rejected answer, not the whole report's mean (the clinician's pair here, whose
    draft shares the oracle's first words)."""
    from orapo_core.train.losses import differing_tokens

    clinician = _clinician_set(dataset, "Findings: No pleural effusion. Small left pneumothorax.")
    common = dict(PAIR_SETTINGS, max_completion_length=16)
    plain = make_trainer(tiny_model, clinician, tmp_path / "plain", **common)
    mean = make_trainer(tiny_model, clinician, tmp_path / "mean", oracle_nll_weight=0.7, **common)
    focused = make_trainer(
        tiny_model, clinician, tmp_path / "focus", oracle_nll_weight=0.7, oracle_nll_focus="differing", **common
    )
    torch.manual_seed(0)
    with torch.no_grad():  # a random tiny model's tokens are near-uniform: make the chosen tokens' log-probs differ
        for p in plain.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    for trainer in (plain, mean, focused):
        trainer.model.load_state_dict(plain.model.state_dict())
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(1)
    batch = focused._generate_and_score_completions([clinician[0]] * K)
    paired = torch.nonzero(batch["orapo_coef"] > 0).flatten()
    selected = focused._select_rows(batch, paired)
    draft = focused._tokenizer("Findings: No pleural effusion.", add_special_tokens=False)["input_ids"]
    dpo, _ = plain.pair_losses(plain.model, batch, paired, plain._select_rows(batch, paired))
    with_mean, _ = mean.pair_losses(mean.model, batch, paired, mean._select_rows(batch, paired))
    loss, _ = focused.pair_losses(focused.model, batch, paired, selected)
    _, tokens = plain._chosen_logps(plain.model, selected, tokens=True)
    expected, partial = [], 0
    for r in range(paired.numel()):
        chosen = selected["orapo_chosen_ids"][r][selected["orapo_chosen_mask"][r].bool()].tolist()
        rejected = selected["orapo_rejected_ids"][r][selected["orapo_rejected_mask"][r].bool()].tolist()
        focus = differing_tokens(chosen, rejected)
        assert selected["orapo_chosen_focus"][r][: len(chosen)].tolist() == focus
        if rejected[: len(draft)] == draft:  # the clinician's draft: its words are not the oracle's to push
            assert focus[: len(draft)] == [0.0] * len(draft) and any(focus)
            partial += 1
        picked = [tokens[r][i].item() for i, f in enumerate(focus) if f]
        expected.append(dpo[r].item() - 0.7 * (sum(picked) / len(picked) if picked else 0.0))
    assert partial == 1
    assert loss.tolist() == pytest.approx(expected, abs=1e-4)
    assert loss.tolist() != pytest.approx(with_mean.tolist(), abs=1e-4)  # not the whole report's mean
    assert loss.requires_grad


def test_differing_tokens_marks_what_the_rejected_answer_left_out():
    from orapo_core.train.losses import differing_tokens

    oracle = [1, 2, 3, 9, 9, 4, 5]  # "1 2 3 <left out> 4 5"
    assert differing_tokens(oracle, [1, 2, 3, 4, 5]) == [0, 0, 0, 1, 1, 0, 0]
    assert differing_tokens(oracle, oracle) == [0.0] * 7
    assert differing_tokens(oracle, []) == [1.0] * 7


def test_a_focused_oracle_nll_leaves_out_the_sentences_of_findings_it_is_told_the_model_cannot_see(
    tiny_model, dataset, tmp_path
):
    """`oracle_nll_skip_findings` (filled from `oracle_nll_min_auc`): the clinician added two findings to the draft;
    with atelectasis skipped, only the pneumothorax sentence's tokens stay in the focused NLL."""
    from orapo_core.train.losses import differing_tokens, kept_tokens

    clinician = _clinician_set(
        dataset, "Findings: No pleural effusion. Small left pneumothorax. Bibasilar atelectasis."
    )
    common = dict(PAIR_SETTINGS, max_completion_length=64, oracle_nll_weight=0.7, oracle_nll_focus="differing")
    skipping = make_trainer(
        tiny_model, clinician, tmp_path / "skip", oracle_nll_skip_findings=["Atelectasis"], **common
    )
    torch.manual_seed(1)
    batch = skipping._generate_and_score_completions([clinician[0]] * K)
    paired = torch.nonzero(batch["orapo_coef"] > 0).flatten()
    selected = skipping._select_rows(batch, paired)
    encode = skipping._encode_answer
    draft = encode("Findings: No pleural effusion.")[:-1]  # without its end-of-answer token
    kept = encode("Findings: No pleural effusion. Small left pneumothorax. ")
    clinician_rows = 0
    for r in range(paired.numel()):
        chosen = selected["orapo_chosen_ids"][r][selected["orapo_chosen_mask"][r].bool()].tolist()
        rejected = selected["orapo_rejected_ids"][r][selected["orapo_rejected_mask"][r].bool()].tolist()
        focus = selected["orapo_chosen_focus"][r][: len(chosen)].tolist()
        every = differing_tokens(chosen, rejected)
        assert focus == [f * k for f, k in zip(every, kept_tokens(chosen, kept), strict=True)]
        if rejected[: len(draft)] == draft:  # the clinician's pair: both added sentences differ, one is kept
            clinician_rows += 1
            assert 0 < sum(focus) < sum(every)
            atelectasis = encode("Bibasilar atelectasis.")[:-1]
            assert not any(focus[-len(atelectasis) - 1 :]), "the atelectasis sentence's tokens are left out"
    assert clinician_rows == 1
