"""What hospital IT watches: the Prometheus metrics, `/healthz` and `/readyz`.

The fast tests hold each part on its own: the counters count only with an app's metrics, the scrape reads the draft
queue, the rounds and the served version when it happens, a draft stays in the queue until answered, failed
sign-ins are counted by reason, the readiness checks say one word each, and the metrics port listens on 127.0.0.1
and is gone after `stop`. The live test launches the app with a fake drafter that loads when the test says so:
`/readyz` is 503 until it loaded, then 200; a draft, a failed sign-in and a refused upload later, an administrator's
scrape of `/metrics` shows each of them, a radiologist is refused, `/healthz` answers with no session at all, and
the metrics port serves the same text until the server stops.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.app import free_port, make_env


class FakeDrafter:
    """Writes the same short report every time, at once."""

    def draft(self, image, **settings):
        from orapo_core.models.draft import Draft

        return Draft(
            text="No pneumothorax.",
            samples=[],
            sentences=[],
            flagged=[],
            model_name="fake",
            model_version="fake",
            prompt="Describe.",
            prompt_version="test",
            sampling={},
            latency_ms=1.0,
        )


def families(text: str) -> dict[str, dict[tuple, float]]:
    """Each sample of the exposition text: {sample name: {sorted label items: value}}."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def scrape(metrics) -> dict[str, dict[tuple, float]]:
    body, content_type = metrics.text()
    assert content_type.startswith("text/plain")
    return families(body.decode())


class FakeModels:
    """What the scrape and the readiness checks ask of a model registry."""

    def __init__(self, state="idle", served=None, resident=(), depth=0):
        self.state, self._served, self._resident, self.depth = state, served, list(resident), depth
        self.metrics = None

    def readiness(self):
        return SimpleNamespace(state=self.state)

    def served(self):
        if self._served is None:
            raise RuntimeError("no model configured")
        return self._served

    def is_loaded(self, served):
        return served.key in self._resident

    def queue_depth(self):
        return self.depth


@pytest.fixture
def env(tmp_path):
    return make_env(tmp_path)


def test_nothing_is_counted_without_metrics_and_each_event_with_them(env):
    from app.services.operations.metrics import AppMetrics, count_draft, count_sign_in_failure, count_uploads
    from app.services.reading.ingest import IngestOutcome

    settings, db = env
    count_draft(None, "v1", 1.0)  # a service used without an app: nothing to count, nothing raised
    count_sign_in_failure(None, "bad_credentials")
    count_uploads(None, [IngestOutcome(file="x.png", ok=False, error="not_an_image")])

    metrics = AppMetrics(settings, db, FakeModels())
    count_draft(metrics, "v1", 1.5)
    count_draft(metrics, "v1", 0.2)
    count_sign_in_failure(metrics, "bad_credentials")
    count_uploads(
        metrics,
        [
            IngestOutcome(file="a.png", ok=False, error="not_an_image"),
            IngestOutcome(file="b.dcm", ok=True, study_id=1),
            IngestOutcome(file="c.png", ok=False, error="file_too_large"),
        ],
    )
    found = scrape(metrics)
    assert found["orapo_drafts_total"] == {(("version", "v1"),): 2.0}
    assert found["orapo_draft_seconds_count"] == {(): 2.0} and found["orapo_draft_seconds_sum"][()] == pytest.approx(
        1.7
    )
    assert found["orapo_draft_seconds_bucket"][(("le", "1.0"),)] == 1.0
    assert found["orapo_sign_in_failures_total"] == {(("reason", "bad_credentials"),): 1.0}
    assert found["orapo_uploads_refused_total"] == {
        (("code", "file_too_large"),): 1.0,
        (("code", "not_an_image"),): 1.0,
    }
    # another app's metrics count apart: no global registry
    assert "orapo_drafts_total" not in scrape(AppMetrics(settings, db, FakeModels()))


def test_a_scrape_reads_the_queue_the_rounds_and_the_served_version_when_it_happens(env):
    from app.services.operations.metrics import AppMetrics
    from app.services.reading.served import ServedModel
    from db import RoundRepository

    settings, db = env
    models = FakeModels(served=ServedModel(None, "starter", settings.resolved_data_dir / "starter"), depth=3)
    metrics = AppMetrics(settings, db, models)
    found = scrape(metrics)
    assert found["orapo_draft_queue_depth"] == {(): 3.0}
    assert set(found["orapo_rounds"]) == {
        (("status", s),) for s in ("queued", "running", "succeeded", "failed", "cancelled", "rejected", "promoted")
    }
    assert sum(found["orapo_rounds"].values()) == 0
    assert found["orapo_served_version_info"] == {(("name", "starter"), ("version", "configured")): 1.0}

    rounds = RoundRepository(db)
    rounds.transition(rounds.create().id, "cancelled")
    rounds.create()
    models.depth, models._served = 0, ServedModel(7, "round-7", settings.resolved_data_dir / "starter")
    found = scrape(metrics)
    assert (
        found["orapo_rounds"][(("status", "cancelled"),)] == 1 and found["orapo_rounds"][(("status", "queued"),)] == 1
    )
    assert found["orapo_draft_queue_depth"] == {(): 0.0}
    assert found["orapo_served_version_info"] == {(("name", "round-7"), ("version", "7")): 1.0}

    models._served = None  # no served model: left out of the scrape, which still answers
    assert "orapo_served_version_info" not in scrape(metrics)


def test_a_draft_is_in_the_queue_until_its_caller_has_it():
    from app.services.reading.draft_batcher import DraftBatcher

    gate, started = threading.Event(), threading.Event()

    class Slow(FakeDrafter):
        def draft(self, image, **settings):
            started.set()
            gate.wait(30)
            return super().draft(image, **settings)

    batcher = DraftBatcher(Slow(), max_wait_s=0)
    assert batcher.depth() == 0
    callers = [threading.Thread(target=batcher.draft, args=(i,)) for i in range(3)]
    for caller in callers:
        caller.start()
    assert started.wait(30)
    deadline = time.monotonic() + 30
    while batcher.depth() < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batcher.depth() == 3  # one drafting, two waiting for the model
    gate.set()
    for caller in callers:
        caller.join(30)
    assert batcher.depth() == 0
    batcher.close()


def test_failed_sign_ins_are_counted_by_reason_and_never_by_name(env):
    import anyio

    from app.services.accounts.signin import SignInGuard
    from app.services.operations.metrics import AppMetrics

    settings, db = env
    guard = SignInGuard(db, account_limit="2 per 15 minutes", hash_slots=1)
    metrics = AppMetrics(settings, db, FakeModels())
    metrics.watch(guard, None)
    for password in ("wrong-1", "wrong-2", "wrong-3"):  # the third is refused by the lockout, unhashed
        assert not anyio.run(guard.sign_in, "rita", password, "10.0.0.9").ok
    assert anyio.run(guard.sign_in, "rita-not-a-user", "x", "10.0.0.8").outcome == "refused"
    found = scrape(metrics)["orapo_sign_in_failures_total"]
    assert found[(("reason", "bad_credentials"),)] == 3 and found[(("reason", "locked_out"),)] == 1
    assert {name for labels in found for name, _ in labels} == {"reason"}  # no name tried, no address
    assert anyio.run(guard.sign_in, "omar", "omar-pass-1", "10.0.0.7").ok  # a success counts nothing
    assert sum(scrape(metrics)["orapo_sign_in_failures_total"].values()) == 4


def test_the_readiness_checks_say_one_word_each():
    from app.services.operations.metrics import readiness_checks
    from app.services.reading.served import ServedModel

    class Up:
        def ping(self):
            pass

    class Down:
        def ping(self):
            raise OSError("connection refused to db.example.org:5432 as orapo")

    served = ServedModel(None, "starter", Path("/models/starter"))
    assert readiness_checks(Up(), FakeModels("ready")) == {"database": "ok", "model": "ok"}
    assert readiness_checks(Up(), FakeModels("loading", served)) == {"database": "ok", "model": "loading"}
    assert readiness_checks(Up(), FakeModels("failed", served)) == {"database": "ok", "model": "failed"}
    assert readiness_checks(Up(), FakeModels("idle", served)) == {"database": "ok", "model": "not_loaded"}
    # never warmed, but a draft loaded the served model since
    assert readiness_checks(Up(), FakeModels("idle", served, resident=[served.key]))["model"] == "ok"
    assert readiness_checks(Down(), FakeModels("ready")) == {"database": "unreachable", "model": "ok"}
    assert readiness_checks(Down(), FakeModels("idle", served, resident=[served.key])) == {
        "database": "unreachable",
        "model": "not_loaded",
    }
    assert readiness_checks(Up(), None) == {"database": "ok", "model": "not_loaded"}


def test_neither_a_scrape_nor_readyz_waits_for_a_model_that_is_loading(tmp_path):
    """A load holds the registry's lock for as long as it takes (a minute on a CPU): what the probes and the scrape
    read of the registry must not wait for it."""
    from app.services.operations.metrics import AppMetrics, readiness_checks
    from app.services.reading.registry import ModelRegistry

    settings, db = make_env(tmp_path, model_dir=tmp_path / "fake-model")  # never read: the loader is a fake
    gate, started = threading.Event(), threading.Event()
    registry = ModelRegistry(settings, db, loader=lambda served: started.set() or gate.wait(60) and FakeDrafter())
    loading = threading.Thread(target=registry.drafter, args=(registry.served(),))
    loading.start()
    try:
        assert started.wait(30)
        began = time.monotonic()
        assert readiness_checks(db, registry) == {"database": "ok", "model": "not_loaded"}
        assert scrape(AppMetrics(settings, db, registry))["orapo_draft_queue_depth"] == {(): 0.0}
        assert time.monotonic() - began < 10
    finally:
        gate.set()
        loading.join(30)
    assert readiness_checks(db, registry) == {"database": "ok", "model": "ok"}  # loaded by a draft, never warmed


def test_the_metrics_port_listens_on_localhost_only_and_closes_with_its_thread(env):
    import httpx

    from app.services.operations.metrics import AppMetrics

    settings, db = env
    port = free_port()
    metrics = AppMetrics(settings.model_copy(update={"metrics_port": port}), db, FakeModels())
    before = set(threading.enumerate())
    assert metrics.start() == port
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert answer.status_code == 200 and "orapo_rounds" in families(answer.text)
        assert metrics._server[0].server_address[0] == "127.0.0.1"
        busy = AppMetrics(settings.model_copy(update={"metrics_port": port}), db, FakeModels())
        assert busy.start() is None  # the port is taken: reported, not raised
    finally:
        metrics.stop()
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    metrics.stop()  # twice is fine
    assert AppMetrics(settings, db, FakeModels()).start() is None  # no port configured: nothing to start


def test_the_health_paths_are_public_and_metrics_is_not():
    from app.services.operations.metrics import HEALTH_PATHS, METRICS_PATH
    from app.web_security import PUBLIC_PATHS

    assert HEALTH_PATHS == {"/healthz", "/readyz"}
    assert HEALTH_PATHS <= PUBLIC_PATHS, "add *HEALTH_PATHS to app.web_security.PUBLIC_PATHS"
    assert METRICS_PATH not in PUBLIC_PATHS


def test_the_routes_answer_without_a_server(env):
    """The routes by themselves: /healthz says ok, /readyz checks the database, /metrics refuses whoever the
    session middleware did not name as an administrator."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from app import ops_routes
    from app.web_security import SESSION_USER

    settings, db = env
    named = {}

    class Named:  # what the session middleware does: name the user in the scope
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if named.get("user"):
                scope[SESSION_USER] = named["user"]
            await self.app(scope, receive, send)

    app = Starlette(routes=ops_routes.routes(settings, db))
    with TestClient(Named(app)) as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        ready = http.get("/readyz")  # no app context here: no model loaded
        assert ready.status_code == 503 and ready.json() == {"database": "ok", "model": "not_loaded"}
        assert ready.headers["cache-control"] == "no-store"
        assert http.get("/metrics").status_code == 403
        named["user"] = "rita"
        assert http.get("/metrics").status_code == 403
        named["user"] = "boss"
        assert http.get("/metrics").status_code == 404  # an administrator, but no app metrics outside an app


# -- the app, live ---------------------------------------------------------------------------------------------


@pytest.mark.slow  # a live server
def test_the_app_counts_what_happens_and_an_administrator_scrapes_it(tmp_path):
    import httpx
    from gradio_client import handle_file

    from app import gradio_internals
    from app.services.reading.registry import ModelRegistry
    from db import RoundRepository
    from tests.support.app import client, launched_app, phantom_png

    settings, db = make_env(tmp_path, model_dir=tmp_path / "fake-model")  # never read: the loader is a fake
    metrics_port = free_port()
    settings = settings.model_copy(update={"metrics_port": metrics_port})
    rounds = RoundRepository(db)
    rounds.transition(rounds.create().id, "cancelled")
    gate = threading.Event()
    registry = ModelRegistry(settings, db, loader=lambda served: gate.wait(120) and FakeDrafter())
    film, note = phantom_png(tmp_path / "film.png", seed=3), tmp_path / "note.png"
    note.write_text("a text file, named as if it were a PNG")
    try:
        with launched_app(settings, db, registry=registry, warm_model=True) as (url, demo):
            origin = {"Origin": url.rstrip("/")}
            with httpx.Client(base_url=url, timeout=30) as anyone:
                assert anyone.get("/healthz").json() == {"status": "ok"}  # no session, no cookie
                ready = anyone.get("/readyz")
                assert ready.status_code == 503 and ready.json() == {"database": "ok", "model": "loading"}
                gate.set()
                deadline = time.monotonic() + 60
                while (ready := anyone.get("/readyz")).status_code != 200 and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert ready.status_code == 200 and ready.json() == {"database": "ok", "model": "ok"}
                assert anyone.get("/metrics").status_code == 401  # a session first
                assert (
                    anyone.post("/login", data={"username": "rita", "password": "not-hers"}, headers=origin).status_code
                    != 200
                )

            rita = client(url, "rita", "rita-pass-1")
            summary = rita.predict([handle_file(str(film))], api_name="/upload_studies")[1]
            assert "Stored" in summary, summary
            rita.predict(api_name="/draft_report")
            summary = rita.predict([handle_file(str(note))], api_name="/upload_studies")[1]
            assert "Refused" in summary, summary

            with (
                httpx.Client(base_url=url, timeout=30, headers=origin) as boss,
                httpx.Client(base_url=url, timeout=30, headers=origin) as omar,
            ):
                assert boss.post("/login", data={"username": "boss", "password": "admin-pass-1"}).status_code == 200
                assert omar.post("/login", data={"username": "omar", "password": "omar-pass-1"}).status_code == 200
                assert omar.get("/metrics").status_code == 403
                answer = boss.get("/metrics")
            assert answer.status_code == 200 and answer.headers["cache-control"] == "no-store"
            found = families(answer.text)
            assert found["orapo_drafts_total"] == {(("version", "fake-model"),): 1.0}
            assert found["orapo_draft_seconds_count"] == {(): 1.0}
            assert found["orapo_draft_queue_depth"] == {(): 0.0}
            assert found["orapo_sign_in_failures_total"] == {(("reason", "bad_credentials"),): 1.0}
            assert found["orapo_uploads_refused_total"] == {(("code", "not_an_image"),): 1.0}
            assert found["orapo_rounds"][(("status", "cancelled"),)] == 1.0
            assert found["orapo_served_version_info"] == {(("name", "fake-model"), ("version", "configured")): 1.0}
            for text in (answer.text, ready.text):  # no user, address, study or path in either
                assert not any(word in text for word in ("rita", "boss", "127.0.0.1", str(tmp_path), "note.png"))

            local = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)  # no session on this port
            assert (
                local.status_code == 200 and families(local.text)["orapo_drafts_total"] == found["orapo_drafts_total"]
            )
            serving = gradio_internals.context_of(demo).metrics._server[1]
        assert not serving.is_alive()  # the server's shutdown closed the port and ended its thread
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
    finally:
        gate.set()
