"""Eight radiologists at once, each in a thread with a client of their own: upload, draft, correct and sign.

The server is the real launched app (as `orapo serve` starts it) serving a tiny
random VLM, so the test is about concurrency, not the model: every correction
must be stored exactly once, with its author and text, and no call may fail.
`benchmarks/bench_load.py` runs the same readers against the starter model and
reports the upload-to-draft times.
"""

from __future__ import annotations

import time

import pytest

from tests.support.app import launched_app, phantom_png
from tests.support.readers import check_stored_once, corrected_text, make_readers, run_readers, summarize

pytestmark = pytest.mark.slow  # a live server and eight readers

READERS = 8


@pytest.mark.timeout(180)
def test_eight_readers_at_once_store_every_correction_exactly_once(tmp_path, tiny_model):
    from app.runtime import open_database
    from orapo_core.config import Settings

    settings = Settings(data_dir=tmp_path / "data", model_dir=tiny_model, deid_secret="test-secret")
    db = open_database(settings)
    accounts = make_readers(db, READERS)
    images = [phantom_png(tmp_path / f"cxr-{i}.png", seed=1000 + i) for i in range(READERS)]
    texts = [corrected_text(i) for i in range(READERS)]
    with launched_app(settings, db) as (url, demo):
        began = time.perf_counter()
        results = run_readers(url, accounts, images, texts)
        wall = time.perf_counter() - began
    errors = [f"{r.username}: {r.error}" for r in results if r.error]
    assert not errors, errors
    check_stored_once(db, results)
    median, p95 = summarize([r.upload_to_draft_s for r in results])
    print(f"\n{READERS} readers, tiny VLM: upload->draft median {median:.2f} s, p95 {p95:.2f} s, wall {wall:.1f} s")
