"""Radiologists reading at once, each in a thread with a client of their own: upload, draft, correct and sign.

Shared by the load test (tests/test_app_load.py) and its benchmark (benchmarks/bench_load.py).
"""

from __future__ import annotations

import math
import re
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ReaderResult:
    username: str
    study_id: int | None = None
    text: str = ""
    upload_s: float | None = None  # upload, ingest and the viewer's first image
    upload_to_draft_s: float | None = None
    total_s: float | None = None
    error: str | None = None


def make_readers(db, count: int, prefix: str = "reader") -> list[tuple[str, str]]:
    """`count` radiologist accounts, ready to use (no one-time password): (username, password)."""
    from db import UserRepository

    users = UserRepository(db)
    accounts = [(f"{prefix}{i}", f"{prefix}-pass-{i}") for i in range(count)]
    for name, password in accounts:
        users.create(name, password)
    return accounts


def read_one_study(
    url: str, username: str, password: str, image: Path, text: str, start: threading.Barrier | None = None
) -> ReaderResult:
    """One radiologist's session: sign in, upload, draft, then save and sign a corrected report (and confirm it)."""
    from gradio_client import Client, handle_file

    result = ReaderResult(username, text=text)
    try:
        try:
            client = Client(
                url, auth=(username, password), verbose=False, download_files=False, headers={"Origin": url.rstrip("/")}
            )
        except Exception:
            if start is not None:
                start.abort()  # the others stop waiting for a reader who will never come
            raise
        if start is not None:
            start.wait(timeout=120)  # everyone signed in: upload together
        began = time.perf_counter()
        summary = client.predict([handle_file(str(image))], api_name="/upload_studies")[1]
        found = re.search(r"Stored \*\*.+?\*\*: study (\d+)", summary)
        if not found:
            raise AssertionError(f"upload refused: {summary}")
        result.study_id = int(found.group(1))
        result.upload_s = time.perf_counter() - began
        client.predict(api_name="/draft_report")
        result.upload_to_draft_s = time.perf_counter() - began
        client.predict(text, api_name="/sign_report")  # shows the exact text to sign and asks
        status = next(
            o
            for o in client.predict(text, api_name="/confirm_report")
            if isinstance(o, str) and o.startswith("Report version")
        )
        if "signed by " + username not in status:
            raise AssertionError(f"not signed: {status}")
        result.total_s = time.perf_counter() - began
    except Exception as exc:  # collected and reported by the caller, never lost in a thread
        result.error = f"{type(exc).__name__}: {exc}"
    return result


def run_readers(url: str, accounts: list[tuple[str, str]], images: list[Path], texts: list[str]) -> list[ReaderResult]:
    """Every reader in its own thread, started together; results in the accounts' order."""
    start = threading.Barrier(len(accounts))
    results: list[ReaderResult | None] = [None] * len(accounts)

    def work(i: int) -> None:
        results[i] = read_one_study(url, *accounts[i], images[i], texts[i], start)

    threads = [threading.Thread(target=work, args=(i,), name=f"reader-{i}") for i in range(len(accounts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return [
        r if r is not None else ReaderResult(accounts[i][0], error="thread did not finish")
        for i, r in enumerate(results)
    ]


def corrected_text(i: int) -> str:
    """A distinct report per reader, which always differs from any draft."""
    return f"Reader {i}: small left pleural effusion. No pneumothorax. Heart size is normal. Reference {i * 7919}."


def check_stored_once(db, results: list[ReaderResult]) -> None:
    """Each reader's study has one draft and one signed report version, by them, with their text; nothing else exists."""
    from db import (
        AuditRepository,
        CorrectionRepository,
        DashboardRepository,
        DraftRepository,
        StudyRepository,
        UserRepository,
    )

    ids = {u.username: u.id for u in UserRepository(db).list()}
    studies = {o.study.id: o for o in StudyRepository(db).list(limit=10_000)}
    assert sorted(studies) == sorted(r.study_id for r in results), "one study per reader, no more"
    for r in results:
        overview = studies[r.study_id]
        assert overview.study.uploaded_by == ids[r.username] and overview.study.status == "signed"
        assert len(DraftRepository(db).for_study(r.study_id)) == 1
        versions = CorrectionRepository(db).history(r.study_id)
        assert [(c.author_id, c.text, c.version, c.signed_at is not None) for c in versions] == [
            (ids[r.username], r.text, 1, True)
        ], r.username
    assert len(AuditRepository(db).query(action="correction.create", limit=100_000)) == len(results)
    counts = DashboardRepository(db).counts()
    assert (counts.studies, counts.corrections, counts.signed_corrections) == (len(results),) * 3
    expected_pairs = sum(1 for o in studies.values() if o.study.split == "train")
    assert counts.pairs == expected_pairs  # one preference pair per corrected training study, none twice


def summarize(seconds: list[float]) -> tuple[float, float]:
    """Median and 95th percentile (nearest rank)."""
    ordered = sorted(seconds)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
    return statistics.median(ordered), p95
