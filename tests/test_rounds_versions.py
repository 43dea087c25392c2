"""Model versions' storage: a candidate copied out of its round folder, and paths stored relative to the data folder."""

from __future__ import annotations

from pathlib import Path


def _settings(tmp_path: Path):
    from orapo_core.config import Settings

    settings = Settings(data_dir=tmp_path / "data", deid_secret="test")
    settings.ensure_dirs()
    return settings


def test_an_installed_adapter_leaves_checkpoints_and_metrics_behind(tmp_path):
    from app.services.reading.served import resolve_path
    from app.services.rounds import Candidate
    from app.services.rounds.plan import Installed
    from app.services.rounds.versions import install_candidate

    settings = _settings(tmp_path)
    output = settings.rounds_dir / "7" / "output"
    (output / "checkpoint-2").mkdir(parents=True)
    (output / "checkpoint-2" / "adapter_model.safetensors").write_bytes(b"old")
    (output / "adapter_config.json").write_text("{}")
    (output / "adapter_model.safetensors").write_bytes(b"weights")
    (output / "metrics.jsonl").write_text('{"step": 1}\n')
    base = tmp_path / "elsewhere" / "base-model"  # outside the data folder: stored as it is

    installed = install_candidate(settings, 7, Candidate(base, output))
    target = settings.models_dir / "versions" / "round-7"
    assert installed == Installed(base=str(base.resolve()), adapter="models/versions/round-7")
    assert sorted(p.name for p in target.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert resolve_path(settings, installed.adapter) == target and resolve_path(settings, None) is None

    (output / "adapter_model.safetensors").write_bytes(b"retrained")  # a rerun replaces, never merges
    install_candidate(settings, 7, Candidate(base, output))
    assert (target / "adapter_model.safetensors").read_bytes() == b"retrained"
    assert not target.with_name("round-7.part").exists()


def test_a_whole_model_candidate_becomes_the_base(tmp_path):
    from app.services.rounds import Candidate
    from app.services.rounds.plan import Installed
    from app.services.rounds.versions import install_candidate

    settings = _settings(tmp_path)
    output = settings.rounds_dir / "3" / "output"
    output.mkdir(parents=True)
    (output / "config.json").write_text("{}")
    assert install_candidate(settings, 3, Candidate(output)) == Installed(base="models/versions/round-3", adapter=None)
