"""How often FactS's attribute check changes the reward on PhantomCXR: the measurement behind the
default of `OraPOConfig.facts_attribute_check`. Prints its numbers and the command that made them.

    OMP_NUM_THREADS=1 .venv/bin/python tests/measure_facts_attributes.py [--studies 300] [--seed 1]
        [--model assets/starter] [--samples 4]

Every completion is scored as the trainer scores it: the FactS reward (beta 1, precision-aware) with
the study's labels and its report as the `reference_report` column, once with the check and once
without. Three kinds of completion per study:

- rephrased: the same findings written again by PhantomCXR's report writer with another seed (other
  sentences and pertinent negatives, the same sides, severities and devices). A correct report: any
  change of its reward is a false contradiction.
- attributes redrawn: the same findings with side, severity, zone and device drawn again from
  PhantomCXR's own distribution: a report that found the findings and guessed their attributes.
  A redrawn study "clearly differs" when a side changed, a severity moved two grades (small vs
  large, mild vs severe) or a device changed; only what the text states can be caught, so the share
  of those whose reward dropped is a lower bound of what the check sees.
- starter rollouts (with --model): `--samples` sampled drafts (temperature 1.0, as GRPO samples
  them) of the model for the study's image.

Lives beside the tests rather than in benchmarks/ only because that folder was being reworked when
it was written; `test_facts_attributes.py` runs it on a few studies.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEVERITY_GRADE = {"small": 1, "mild": 1, "moderate": 2, "large": 3, "severe": 3, "marked": 3}


def redraw_attributes(findings, rng):
    """The same findings, each with side, severity, zone and device drawn again by PhantomCXR's sampler."""
    from orapo_core.data.phantom import sample_findings

    out = []
    for f in findings:
        fresh = sample_findings(rng, {f.kind: 1.0})[0]
        if not f.certain:  # hedged findings are drawn mild and one-sided; keep what the writer can say
            fresh = dataclasses.replace(
                fresh, severity=f.severity, side=f.side if f.side == "bilateral" else fresh.side
            )
        out.append(
            dataclasses.replace(
                f,
                side=fresh.side if f.side else None,
                severity=fresh.severity if f.severity else None,
                location=fresh.location if f.location else None,
            )
        )
    return out


def clearly_differs(before, after) -> bool:
    devices = {f.location for f in before if f.kind == "support_devices"}
    for a, b in zip(before, after):
        if a.kind == "support_devices":
            if b.location not in devices:
                return True
            continue
        if a.side and b.side and a.side != b.side:
            return True
        if (
            a.certain
            and a.severity
            and b.severity
            and abs(SEVERITY_GRADE[a.severity] - SEVERITY_GRADE[b.severity]) >= 2
        ):
            return True
    return False


def phantom_studies(n: int, seed: int, with_images: bool):
    """(findings, report text, labels, image or None) per study; study i depends only on (seed, i)."""
    import numpy as np

    from orapo_core.data.phantom import generate_study, resolve_prevalence, sample_findings
    from orapo_core.data.phantom_reports import write_report

    for i in range(n):
        rng = np.random.default_rng([seed, i])
        if with_images:
            study = generate_study(rng)
            findings, text, labels = (
                study.findings,
                f"FINDINGS: {study.report_findings}\nIMPRESSION: {study.report_impression}",
                study.labels,
            )
            yield i, findings, text, labels, study.image_uint16()
        else:
            findings = sample_findings(rng, resolve_prevalence())
            body, impression, labels = write_report(findings, rng, "PA")
            yield i, findings, f"FINDINGS: {body}\nIMPRESSION: {impression}", labels, None


def measure(studies: int, seed: int, model: str | None = None, samples: int = 4, batch: int = 16) -> dict:
    import numpy as np

    from orapo_core.data.phantom_reports import write_report
    from orapo_core.facts import make_facts_reward

    with_check = make_facts_reward(attribute_check=True)
    without = make_facts_reward(attribute_check=False)
    rows: dict[str, list[tuple[str, str, dict]]] = {"rephrased": [], "redrawn": [], "starter": []}
    differs: list[bool] = []
    images, references = [], []
    for i, findings, reference, labels, image in phantom_studies(studies, seed, with_images=model is not None):
        rng = np.random.default_rng([seed, i, 1])
        body, impression, _ = write_report(findings, rng, "PA")
        rows["rephrased"].append((f"FINDINGS: {body}\nIMPRESSION: {impression}", reference, labels))
        redrawn = redraw_attributes(findings, rng)
        body, impression, _ = write_report(redrawn, rng, "PA")
        rows["redrawn"].append((f"FINDINGS: {body}\nIMPRESSION: {impression}", reference, labels))
        differs.append(clearly_differs(findings, redrawn))
        if model is not None:
            images.append(image)
            references.append((reference, labels))
    if model is not None:
        from orapo_core.models.draft import Drafter

        drafter = Drafter.from_dir(model)
        for start in range(0, len(images), batch):
            drafts = drafter.draft_many(images[start : start + batch], samples=samples, temperature=1.0, seed=seed)
            for draft, (reference, labels) in zip(drafts, references[start : start + batch]):
                rows["starter"].extend((text, reference, labels) for text in draft.samples)

    results = {}
    for kind, items in rows.items():
        if not items:
            continue
        completions = [c for c, _, _ in items]
        kwargs = dict(labels=[lab for _, _, lab in items], reference_report=[r for _, r, _ in items])
        started = time.perf_counter()
        plain = without(completions, **kwargs)
        t_plain = time.perf_counter() - started
        started = time.perf_counter()
        checked = with_check(completions, **kwargs)
        t_checked = time.perf_counter() - started
        changed = [i for i, (a, b) in enumerate(zip(plain, checked)) if abs(a - b) > 1e-12]
        result = {
            "completions": len(items),
            "changed": len(changed),
            "changed_share": len(changed) / len(items),
            "mean_reward_without": statistics.fmean(plain),
            "mean_reward_with": statistics.fmean(checked),
            "mean_drop_when_changed": statistics.fmean(plain[i] - checked[i] for i in changed) if changed else 0.0,
            "zero_reward_without": sum(r == 0 for r in plain) / len(items),
            "zero_reward_with": sum(r == 0 for r in checked) / len(items),
            "reward_ms_per_completion_without": 1000 * t_plain / len(items),
            "reward_ms_per_completion_with": 1000 * t_checked / len(items),
        }
        if kind == "redrawn":
            flagged = [i for i, d in enumerate(differs) if d]
            result["clearly_differ"] = len(flagged)
            result["clearly_differ_dropped"] = sum(checked[i] < plain[i] for i in flagged)
            result["same_attributes_changed"] = sum(1 for i in changed if not differs[i])
        results[kind] = result
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1, help="PhantomCXR seed (the starter was built on seed 0)")
    parser.add_argument("--model", default=None, help="a model folder to sample rollouts from, e.g. assets/starter")
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args(argv)
    print(
        "$ OMP_NUM_THREADS=1 .venv/bin/python tests/measure_facts_attributes.py "
        + " ".join(sys.argv[1:] if argv is None else argv)
    )
    for kind, r in measure(args.studies, args.seed, args.model, args.samples).items():
        line = (
            f"{kind:10s} {r['completions']:5d} completions: reward changed for {r['changed']} ({100 * r['changed_share']:.1f}%), "
            f"mean reward {r['mean_reward_without']:.3f} -> {r['mean_reward_with']:.3f} "
            f"(drop {r['mean_drop_when_changed']:.3f} where changed), zero-reward share "
            f"{r['zero_reward_without']:.3f} -> {r['zero_reward_with']:.3f}, "
            f"{r['reward_ms_per_completion_without']:.2f} -> {r['reward_ms_per_completion_with']:.2f} ms/completion"
        )
        if kind == "redrawn":
            line += (
                f"; {r['clearly_differ']} clearly differ, of which {r['clearly_differ_dropped']} lost reward; "
                f"{r['same_attributes_changed']} changed without a clear difference"
            )
        print(line)


if __name__ == "__main__":
    main()
