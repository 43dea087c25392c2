"""Why a model does not say a finding it was taught: its sentence in the reference report, read by the model.

For each rare finding, on held-out PhantomCXR studies with it, the reference report is read by the model under
teacher forcing (prompt, image, then the report, as the trainer reads an oracle). At the first sentence that
states the finding (FactS's own sentence split and labels) it records:

- the mean per-token log-prob of that sentence, and of the report's other sentences;
- the log-prob of the sentence's first token where it starts, and whether the model would pick it there
  (greedy: the first token is the argmax) -- the point where a greedy draft decides to say the finding;
- the first token the model prefers there instead, and how often;
- the log-prob of the sentence's least likely token, and how often every token of it is the argmax (the model,
  given the report up to there, would write exactly that sentence).

With `--state-probe-n N`, how well the text model's state carries each finding where a report decides: a ridge
readout's cross-fitted AUC from the state at the prompt and after fixed report text (the same for every film).

Beside it, from the model's greedy drafts of the same studies and of as many without the finding: the share of
drafts that state the finding on films with it (recall) and without it. Run it on the starter and on a trained
model (an ablation run kept with `bench_learning --keep-weights`) and compare:

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_sentence_logp --model assets/starter \
        [--adapter DIR] --prevalence pneumothorax=0.25 fracture=0.25 lung_lesion=0.25 pleural_other=0.25 --json OUT
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.ablation import HeldOut, phantom_split
from orapo_core.facts import label_report
from orapo_core.facts.text import split_sentences
from orapo_core.models.picture import to_rgb_image
from orapo_core.models.prompt import render_prompt
from orapo_core.models.scoring import answer_token_logps

ROOT = Path(__file__).resolve().parents[1]

RARE = ("Pneumothorax", "Fracture", "Lung Lesion", "Pleural Other")


def finding_sentence(report: str, finding: str):
    """The first sentence of `report` whose FactS labels state `finding` (present or uncertain), or None."""
    for sentence in split_sentences(report):
        if label_report(sentence.text).get(finding) in (1, -1):
            return sentence
    return None


def read_reports(loaded, images, reports, *, batch: int = 8):
    """Per report: its token ids, each token's character span, per-token log-probs and the argmax token ids."""
    tokenizer = loaded.processor.tokenizer
    out = []
    loaded.model.eval()
    for start in range(0, len(reports), batch):
        pictures = [to_rgb_image(x) for x in images[start : start + batch]]
        encoded = [
            tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            for text in reports[start : start + batch]
        ]
        token, best, _ = answer_token_logps(loaded.model, loaded.processor, pictures, [e["input_ids"] for e in encoded])
        for i, e in enumerate(encoded):
            n = len(e["input_ids"])
            out.append(
                {
                    "ids": e["input_ids"],
                    "spans": e["offset_mapping"],
                    "logp": token[i, :n].tolist(),
                    "argmax": best[i, :n].tolist(),
                }
            )
    return out


def sentence_tokens(read: dict, start: int, end: int) -> list[int]:
    """Indices of the tokens whose span lies within [start, end) (leading spaces belong to the token)."""
    return [j for j, (a, b) in enumerate(read["spans"]) if b > start and a < end]


def measure(loaded, records, images, drafts, finding: str, tokenizer) -> dict:
    """The finding's sentence read by the model on the records with it, and the drafts' statements of it."""
    positives = [i for i, r in enumerate(records) if r.labels.get(finding) == 1]
    negatives = [i for i, r in enumerate(records) if r.labels.get(finding) in (0, None)]
    chosen = [(i, finding_sentence(records[i].report, finding)) for i in positives]
    chosen = [(i, s) for i, s in chosen if s is not None]
    reads = read_reports(loaded, [images[i] for i, _ in chosen], [records[i].report for i, _ in chosen])
    sentence_lp, other_lp, first_lp, first_wins, position, worst_lp, whole = [], [], [], 0, [], [], 0
    preferred: collections.Counter = collections.Counter()
    for (_i, sentence), read in zip(chosen, reads, strict=True):
        inside = sentence_tokens(read, sentence.start, sentence.end)
        if not inside:
            continue
        own = set(inside)
        rest = [j for j in range(len(read["ids"])) if j not in own]
        sentence_lp.append(statistics.fmean(read["logp"][j] for j in inside))
        if rest:
            other_lp.append(statistics.fmean(read["logp"][j] for j in rest))
        first = inside[0]
        first_lp.append(read["logp"][first])
        worst_lp.append(min(read["logp"][j] for j in inside))
        whole += all(read["argmax"][j] == read["ids"][j] for j in inside)
        position.append(first)
        if read["argmax"][first] == read["ids"][first]:
            first_wins += 1
        else:
            preferred[
                tokenizer.decode([read["argmax"][first]]).strip() or repr(tokenizer.decode([read["argmax"][first]]))
            ] += 1
    said = lambda i: label_report(drafts[i]).get(finding) in (1, -1)  # noqa: E731
    n = len(first_lp)
    return {
        "studies_with": len(positives),
        "sentences_read": n,
        "sentence_logp": statistics.fmean(sentence_lp) if sentence_lp else None,
        "other_sentences_logp": statistics.fmean(other_lp) if other_lp else None,
        "first_token_logp": statistics.fmean(first_lp) if first_lp else None,
        "first_token_is_greedy": first_wins / n if n else None,
        "first_token_position": statistics.median(position) if position else None,
        "worst_token_logp": statistics.fmean(worst_lp) if worst_lp else None,
        "whole_sentence_is_greedy": whole / n if n else None,
        "preferred_instead": preferred.most_common(5),
        "draft_recall": sum(map(said, positives)) / len(positives) if positives else None,
        "draft_false_positive_rate": sum(map(said, negatives)) / len(negatives) if negatives else None,
    }


# Report text read before the state is taken: the same words for every film, so only the image differs.
STATE_CONTEXTS = {
    "prompt": "",
    "after one sentence": "FINDINGS: The heart is normal in size.",
    "after three sentences": "FINDINGS: The heart is normal in size. Normal mediastinal contours. No pulmonary edema.",
}


def state_probe_auc(loaded, records, images, *, folds: int = 5) -> dict:
    """Per context of `STATE_CONTEXTS` and rare finding: the cross-fitted AUC of a ridge readout of the finding
    from the text model's last-layer state at the context's last token (`orapo_core.models.verifier.fit_check`,
    the verifier's own readout): how well the state a report decides in carries the finding."""
    from orapo_core.models.verifier import fit_check, prompt_states  # noqa: PLC0415 -- loads numpy

    prompt = render_prompt(loaded.processor)
    pictures = [to_rgb_image(x) for x in images]
    out = {}
    for name, text in STATE_CONTEXTS.items():
        states = prompt_states(loaded.model, loaded.processor, prompt + text, pictures)
        out[name] = {
            f: fit_check(states, [r.labels.get(f) == 1 for r in records], f, folds=folds).cross_fitted_auc for f in RARE
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "assets" / "starter"), help="model folder")
    parser.add_argument("--adapter", help="LoRA adapter folder of a trained run (default: the model alone)")
    parser.add_argument("--n", type=int, default=200, help="held-out PhantomCXR studies")
    parser.add_argument("--seed", type=int, default=202, help="PhantomCXR generator seed of the held-out studies")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--prevalence", nargs="+", default=[], metavar="FINDING=P")
    parser.add_argument(
        "--data", default=str(ROOT / "benchmarks" / "out" / "sentence-logp"), help="where the studies go"
    )
    parser.add_argument("--max-new-tokens", type=int, default=112)
    parser.add_argument(
        "--state-probe-n",
        type=int,
        default=0,
        help="also probe the text model's state for each rare finding on this many more held-out "
        "studies (seed + 1), at the prompt and after fixed report text (default: 0, off)",
    )
    parser.add_argument("--json", help="write the results here")
    opts = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- loads numpy
    from orapo_core.models.evaluate import evaluate_drafter  # noqa: PLC0415 -- tests patch evaluate_drafter

    torch.set_num_threads(1)
    prevalence = {k: float(v) for k, v in (p.split("=", 1) for p in opts.prevalence)}
    started = time.perf_counter()
    tag = "".join(f"-{k}{v:g}" for k, v in sorted(prevalence.items()))
    _, records = phantom_split(
        Path(opts.data) / f"seed{opts.seed}-n{opts.n}{tag}", opts.n, opts.seed, opts.size, prevalence=prevalence or None
    )
    held = HeldOut(records)
    drafter = Drafter.from_dir(opts.model, opts.adapter)
    result = evaluate_drafter(
        drafter, held.records, images=held.images, batch_size=32, max_new_tokens=opts.max_new_tokens
    )
    drafts = [p["draft"] for p in result.predictions]
    tokenizer = drafter.loaded.processor.tokenizer
    out = {
        "model": opts.model,
        "adapter": opts.adapter,
        "n": opts.n,
        "seed": opts.seed,
        "prevalence": prevalence,
        **result.metrics.headline(),
        "findings": {f: measure(drafter.loaded, held.records, held.images, drafts, f, tokenizer) for f in RARE},
    }
    if opts.state_probe_n:
        _, probe_records = phantom_split(
            Path(opts.data) / f"seed{opts.seed + 1}-n{opts.state_probe_n}{tag}",
            opts.state_probe_n,
            opts.seed + 1,
            opts.size,
            prevalence=prevalence or None,
        )
        probe = HeldOut(probe_records)
        out["state_probe_auc"] = state_probe_auc(drafter.loaded, probe.records, probe.images)
    out["seconds"] = time.perf_counter() - started
    print(
        "| finding | with it | sentence log-prob (others) | first token log-prob | first token is greedy | "
        "least likely token | whole sentence greedy | preferred instead | draft recall | draft FPR |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for f, m in out["findings"].items():
        fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
        print(
            f"| {f} | {m['studies_with']} | {fmt(m['sentence_logp'])} ({fmt(m['other_sentences_logp'])}) | "
            f"{fmt(m['first_token_logp'])} | {fmt(m['first_token_is_greedy'])} | {fmt(m['worst_token_logp'])} | "
            f"{fmt(m['whole_sentence_is_greedy'])} | "
            f"{', '.join(f'{t} {c}' for t, c in m['preferred_instead'][:3])} | {fmt(m['draft_recall'])} | "
            f"{fmt(m['draft_false_positive_rate'])} |"
        )
    if opts.state_probe_n:
        print(f"\nState probe (cross-fitted AUC, {opts.state_probe_n} studies):\n| state | " + " | ".join(RARE) + " |")
        print("|---|" + "---|" * len(RARE))
        for name, aucs in out["state_probe_auc"].items():
            print(f"| {name} | " + " | ".join(f"{aucs[f]:.3f}" for f in RARE) + " |")
    if opts.json:
        Path(opts.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
