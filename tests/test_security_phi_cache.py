"""No uploaded original outlives a crash or a stop of `orapo serve`.

The end-to-end cases run the real command in a subprocess on 127.0.0.1, upload
DICOMs whose headers carry made-up names, IDs and addresses (one of them only
half sent, so the server holds a partial upload), then kill the server with
SIGKILL or stop it with SIGTERM/SIGINT, start it again, and read every byte of
every file in the data folder: none of those strings may be found, also when
another server on the same data folder is alive (each server has its own cache
folder, deleted whole once that server is dead). The sweeps themselves are also
tested on a fake data folder, file by file, with live and dead servers' folders.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.app import free_port, make_env

pytestmark = pytest.mark.slow  # servers in child processes, stopped and killed

START_TIMEOUT_S = 60


# --- a data folder with originals that carry PHI --------------------------------------------------------------------


def phi_dicoms(folder: Path, count: int) -> tuple[list[Path], list[str]]:
    """`count` small CR DICOMs, each with its own made-up name, ID and address; returns them and those strings."""
    import numpy as np
    import pydicom

    from orapo_core.data.phantom_io import write_dicom

    folder.mkdir(parents=True, exist_ok=True)
    nonce = secrets.token_hex(4).upper()
    paths, phi = [], []
    for i in range(count):
        path = folder / f"batch-{i}.dcm"
        write_dicom(path, np.random.default_rng(i).random((384, 384)), "PA", seed=97, index=i)
        ds = pydicom.dcmread(path)
        ds.PatientName = f"Quarrington^Philomena{nonce}{i}"
        ds.PatientID = f"PHIMRN{nonce}{i}"
        ds.PatientAddress = f"{i + 7} Marrowbone Lane, Phi{nonce}ville"
        ds.save_as(path, enforce_file_format=True)
        strings = [str(ds.PatientName), ds.PatientID, ds.PatientAddress]
        assert all(s.encode() in path.read_bytes() for s in strings)  # the original does carry them
        paths.append(path)
        phi += strings
    return paths, phi


def phi_found(data_dir: Path, phi: list[str]) -> list[str]:
    """'<file>: <string>' for every PHI string in any file's bytes or in any path under `data_dir`."""
    needles = [s.encode() for s in phi]
    found = []
    for path in sorted(data_dir.rglob("*")):
        rel = path.relative_to(data_dir).as_posix()
        found += [f"{rel}: in its name" for s in phi if s in rel]
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            found += [f"{rel}: {n.decode()}" for n in needles if n in data]
    return found


# --- `orapo serve` in a subprocess ------------------------------------------------------------------------------


class Served:
    """`orapo serve --no-model` on a free local port, with its stdout and stderr kept in files."""

    def __init__(self, root: Path, settings):
        self.root, self.settings = root, settings
        self.starts = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        import httpx

        self.starts += 1
        self.port = free_port()
        orapo = Path(sys.executable).with_name("orapo")
        command = [str(orapo)] if orapo.exists() else [sys.executable, "-m", "app.cli"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORAPO_")}
        env.update(
            ORAPO_DATA_DIR=str(self.settings.resolved_data_dir),
            ORAPO_DEID_SECRET="test-secret",
            GRADIO_ANALYTICS_ENABLED="False",
            HF_HUB_OFFLINE="1",
            OMP_NUM_THREADS="1",
        )
        self.out = self.root / f"serve-{self.starts}.out"
        self.err = self.root / f"serve-{self.starts}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [*command, "serve", "--no-model", "--host", "127.0.0.1", "--port", str(self.port)],
                cwd=Path(__file__).parents[1],
                env=env,
                stdout=out,
                stderr=err,
            )
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"orapo serve exited with {self.proc.returncode}: {self.log()}"
            try:
                if httpx.get(url + "/", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"orapo serve did not answer within {START_TIMEOUT_S} s: {self.log()}")

    def log(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def stop(self, sig: int, timeout: float = 30) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def served(tmp_path):
    settings, db = make_env(tmp_path)
    server = Served(tmp_path, settings)
    yield server, settings, db
    server.close()


def signed_in(url: str, user: str = "rita", password: str = "rita-pass-1"):
    import httpx

    http = httpx.Client(base_url=url, timeout=30, headers={"Origin": url})
    assert http.post("/login", data={"username": user, "password": password}).status_code == 200
    return http


def upload_to_cache(http, paths: list[Path]) -> list[str]:
    """What a browser does on drop, before the upload event runs: the files go to Gradio's upload route."""
    response = http.post(
        "/gradio_api/upload", files=[("files", (p.name, p.read_bytes(), "application/dicom")) for p in paths]
    )
    assert response.status_code == 200, response.text
    return response.json()


class HalfUpload:
    """An upload whose client sends the headers and half of the file, then waits: the server holds a partial
    original (with its PHI, which comes first in a DICOM) until the connection ends."""

    def __init__(self, url: str, cookies, path: Path):
        self.release = threading.Event()
        self.error: BaseException | None = None
        data = path.read_bytes()
        boundary = "orapo-phi-test-boundary"
        self.head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{path.name}"\r\n'
            f"Content-Type: application/dicom\r\n\r\n"
        ).encode() + data[: len(data) // 2]
        self.headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        self.url, self.cookies = url, cookies
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _body(self):
        yield self.head
        self.release.wait(60)

    def _send(self) -> None:
        import httpx

        try:
            with httpx.Client(
                base_url=self.url, cookies=self.cookies, timeout=90, headers={"Origin": self.url}
            ) as http:
                http.post("/gradio_api/upload", content=self._body(), headers=self.headers)
        except BaseException as exc:  # noqa: BLE001 - the server goes away under it: expected
            self.error = exc

    def end(self) -> None:
        self.release.set()
        self.thread.join(30)


def wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def originals_in_flight(url: str, cache: Path, phi: list[str], batch: list[Path]):
    """Signed in, the batch uploaded into the cache but for its last file, which is half sent: every one of
    the batch's PHI strings now sits in the cache, as the upload event has not run."""
    http = signed_in(url)
    upload_to_cache(http, batch[:-1])
    half = HalfUpload(url, http.cookies, batch[-1])

    def every_string_on_disk() -> bool:
        return {hit.split(": ", 1)[1] for hit in phi_found(cache, phi)} == set(phi)

    wait_for(every_string_on_disk, "the partial upload on disk")
    return http, half


def stored_image_files(settings) -> set[str]:
    return {p.relative_to(settings.storage_dir).as_posix() for p in settings.storage_dir.rglob("*") if p.is_file()}


# --- end to end -----------------------------------------------------------------------------------------------


def test_a_killed_server_leaves_no_original_after_its_restart(served, tmp_path):
    """kill -9 mid-batch: whatever sat in the cache (whole uploads, a half-sent one) is gone once the server
    is back, and the study ingested before the kill is still whole."""
    from gradio_client import Client, handle_file

    from app.runtime import upload_cache_dir

    server, settings, db = served
    batch, phi = phi_dicoms(tmp_path / "originals", 4)
    cache = upload_cache_dir(settings)
    url = server.start()

    rita = Client(url, auth=("rita", "rita-pass-1"), verbose=False, download_files=False, headers={"Origin": url})
    summary = rita.predict([handle_file(str(batch[0]))], api_name="/upload_studies")[1]
    assert "Stored **batch-0.dcm**: study" in summary
    # The ingested original is gone, and so is the empty temporary file Gradio makes per upload; the viewer
    # fetches its pixels from the app's own route, so no rendering of the study lands in the cache either.
    assert phi_found(cache, phi[:3]) == []
    assert [p.name for p in cache.rglob("*") if p.name.startswith("tmp") or p.suffix == ".dcm"] == []
    assert [p.name for p in cache.rglob("*") if p.suffix.lower() in {".png", ".webp", ".jpg", ".jpeg"}] == []
    ingested = stored_image_files(settings)
    assert len(ingested) == 2  # its de-identified DICOM and display PNG

    http, half = originals_in_flight(url, cache, phi[3:], batch[1:])
    try:
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        half.end()
        http.close()
    assert phi_found(settings.resolved_data_dir, phi)  # what a crash leaves: the sweep at start must find it

    server.start()
    assert phi_found(settings.resolved_data_dir, phi) == []
    assert stored_image_files(settings) == ingested  # the sweep keeps every image with a database row
    sweep = next(line for line in server.log().splitlines() if "start-up sweep" in line)
    removed = int(sweep.split("removed ")[1].split()[0])
    assert removed >= 3, sweep  # two whole uploads and the half-sent one (no viewer rendering is cached any more)
    assert not any(s in sweep for s in phi) and "batch-" not in sweep  # counts only, no names
    assert server.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_server_leaves_no_original(served, tmp_path, sig):
    """SIGTERM (Docker, systemd) and SIGINT (Ctrl-C) mid-batch: the server closes and empties the cache
    before it exits, so no original is left even before a restart."""
    from app.runtime import upload_cache_dir

    server, settings, db = served
    batch, phi = phi_dicoms(tmp_path / "originals", 3)
    cache = upload_cache_dir(settings)
    url = server.start()
    http, half = originals_in_flight(url, cache, phi, batch)
    try:
        assert server.stop(sig) == 0, server.log()
    finally:
        half.end()
        http.close()
    assert phi_found(settings.resolved_data_dir, phi) == []
    assert list(cache.rglob("*")) == []
    assert "stop sweep" in server.log() and "Closing server" in server.log()

    server.start()
    assert phi_found(settings.resolved_data_dir, phi) == []
    assert server.stop(signal.SIGTERM) == 0


def test_a_killed_servers_originals_go_at_the_next_start_while_another_server_runs(tmp_path):
    """Two servers on one data folder: B is killed mid-batch while A runs; a third server's start deletes B's
    folder whole at once (no hour's wait for A's sake), and leaves A's upload where A serves it. The last server
    to stop leaves an empty cache."""
    import psutil

    from app.runtime import server_cache_dir, upload_cache_dir
    from app.services.operations.leader import ServerIdentity

    settings, db = make_env(tmp_path)
    servers = {name: Served(tmp_path / name, settings) for name in "abc"}
    for server in servers.values():
        server.root.mkdir()
    a, b, c = servers.values()
    batch, phi = phi_dicoms(tmp_path / "originals", 3)
    try:
        a_url, b_url = a.start(), b.start()

        def cache_of(server) -> Path:
            pid = server.proc.pid
            return server_cache_dir(
                settings, ServerIdentity(socket.gethostname(), pid, round(psutil.Process(pid).create_time(), 2))
            )

        b_cache = cache_of(b)
        alice = signed_in(a_url)
        (a_upload,) = upload_to_cache(alice, [_file(tmp_path / "no-phi.dcm", b"DICM nobody's data")])
        assert Path(a_upload).parent.parent == cache_of(a)
        http, half = originals_in_flight(b_url, b_cache, phi, batch)
        try:
            assert b.stop(signal.SIGKILL) == -signal.SIGKILL
        finally:
            half.end()
            http.close()
        assert phi_found(b_cache, phi)

        c.start()
        assert phi_found(settings.resolved_data_dir, phi) == [] and not b_cache.exists()
        assert Path(a_upload).is_file() and alice.get(f"/gradio_api/file={a_upload}").status_code == 200
        alice.close()
        assert a.stop(signal.SIGTERM) == 0 and c.stop(signal.SIGTERM) == 0
        assert list(upload_cache_dir(settings).iterdir()) == []
    finally:
        for server in servers.values():
            server.close()


# --- the sweep on a fake data folder --------------------------------------------------------------------------


def _aged(path: Path, seconds: float, now: float) -> Path:
    os.utime(path, (now - seconds, now - seconds))
    return path


def _file(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_the_start_sweep_empties_the_cache_of_the_old_layout_keeps_rows_and_removes_the_rest(tmp_path):
    """No other server alive: the whole cache goes, as with a single server; stored files with a row stay."""
    from app.runtime import upload_cache_dir
    from app.services.operations.cache_sweep import ORPHAN_GRACE_S, sweep_at_start
    from app.services.operations.export_downloads import DOWNLOAD_RETENTION_S, work_dir
    from db import StudyRepository

    settings, db = make_env(tmp_path)
    now = time.time()
    cache, storage = upload_cache_dir(settings), settings.storage_dir
    # The single-folder cache of earlier versions: an original in its hash folder, a half-written upload, a
    # render, a link, an empty folder and an export zip still within its download time.
    _file(cache / "0a1b2c" / "Doe^John-1961.dcm", b"DICM PatientName=Doe^John")
    _file(cache / "tmpk2j3h4", b"DICM half an upload")
    _file(cache / "e4f5" / "image.webp")
    (cache / "link").symlink_to(storage)
    (cache / "empty").mkdir()
    _file(cache / "exports" / ("a" * 32) / "orapo-fhir.zip")
    # A work folder an export killed mid-way left.
    for path in (_file(work_dir(settings) / "fhir-x1" / "fhir" / "study-1.json"), *work_dir(settings).rglob("*")):
        _aged(path, DOWNLOAD_RETENTION_S + 60, now)
    # Storage: a study's files with their row, old and recent partial writes, old and recent orphans.
    study = StudyRepository(db).create("uidhash", "ANON-1")
    kept = [_file(storage / "ab" / "abcd" / "kept.dcm"), _file(storage / "ab" / "abcd" / "kept.png")]
    StudyRepository(db).add_image(
        study.id,
        display_path="ab/abcd/kept.png",
        dicom_path="ab/abcd/kept.dcm",
        width=1,
        height=1,
        source_format="dicom",
    )
    old = ORPHAN_GRACE_S + 60
    _aged(_file(storage / "ab" / "abcd" / ".part-x8y9"), old, now)
    _aged(_file(storage / "cd" / "cdef" / ".part-q1w2"), old, now)
    _aged(_file(storage / "cd" / "cdef" / "orphan.dcm"), old, now)
    _aged(_file(storage / "cd" / "cdef" / "orphan.png"), old, now)
    _aged(storage / "cd" / "cdef", old, now)
    fresh = [_file(storage / "ef" / "efgh" / "being-ingested.dcm"), _file(storage / "ef" / "efgh" / ".part-z0")]

    report = sweep_at_start(settings, db, now=now)

    assert (
        report.cache_files,
        report.exports,
        report.partial_images,
        report.orphan_images,
        report.recent_unreferenced,
    ) == (5, 1, 2, 2, 2)
    assert list(cache.iterdir()) == []
    assert storage.is_dir()  # the link was removed, not followed
    assert not work_dir(settings).exists() or not any(work_dir(settings).iterdir())
    assert sorted(p.relative_to(storage).as_posix() for p in storage.rglob("*") if p.is_file()) == sorted(
        p.relative_to(storage).as_posix() for p in kept + fresh
    )
    assert not (storage / "cd").exists()  # study folders it emptied go too
    line = report.line("start-up sweep")
    assert line.startswith(
        "orapo: start-up sweep: removed 5 file(s) from the upload cache, 1 expired export(s), "
        "2 partial image write(s), 2 stored image(s) without a database row; kept 2 "
    )
    assert "Doe" not in line and "orphan" not in line  # counts, never names

    again = sweep_at_start(settings, db, now=now)
    assert (again.cache_files, again.exports, again.partial_images, again.orphan_images) == (0, 0, 0, 0)


def test_the_stop_sweep_deletes_the_servers_own_folder_exports_included(tmp_path):
    from app.runtime import server_cache_dir, upload_cache_dir
    from app.services.operations.cache_sweep import sweep_at_stop
    from app.services.operations.export_downloads import downloads_dir

    settings, db = make_env(tmp_path)
    _file(downloads_dir(settings) / ("a" * 32) / "orapo-fhir.zip")
    _file(server_cache_dir(settings) / "0a1b2c" / "original.dcm")
    assert downloads_dir(settings).parent == server_cache_dir(settings) != upload_cache_dir(settings)
    stored = _file(settings.storage_dir / "ab" / "abcd" / "orphan-but-not-the-stop-sweeps-business.dcm")
    report = sweep_at_stop(settings, db)
    assert report.cache_files == 2 and list(upload_cache_dir(settings).iterdir()) == []
    assert stored.is_file()
    assert report.line("stop sweep") == "orapo: stop sweep: removed 2 file(s) from the upload cache"


# --- several servers on one data folder -----------------------------------------------------------------------


class Servers:
    """Server folders in one upload cache, each with an original in it, and the sign-of-life leases the sweeps
    judge them by; processes on this machine are real ones (`python -c sleep`), started here."""

    def __init__(self, settings, db):
        self.settings, self.db = settings, db
        self.procs: list[subprocess.Popen] = []

    def folder(self, identity, lease: str | None) -> Path:
        """`identity`'s cache folder holding an original; `lease`: "live", "expired" or None (never took one)."""
        from app.runtime import server_cache_dir
        from app.services.operations.leader import SERVER_PREFIX
        from db import LeaseRepository

        folder = server_cache_dir(self.settings, identity)
        _file(folder / "0a1b2c" / "Doe^John-1961.dcm", b"DICM PatientName=Doe^John")
        if lease is not None:
            leases = LeaseRepository(self.db)
            assert leases.acquire(SERVER_PREFIX + identity.key, identity.key, 600)
            if lease == "expired":
                leases.release(SERVER_PREFIX + identity.key, identity.key)
        return folder

    def local_process(self):
        """A real process on this machine, and its identity as a server would give it."""
        import socket

        import psutil

        from app.services.operations.leader import ServerIdentity

        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        self.procs.append(proc)
        return proc, ServerIdentity(socket.gethostname(), proc.pid, round(psutil.Process(proc.pid).create_time(), 2))

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def servers(tmp_path):
    settings, db = make_env(tmp_path)
    folders = Servers(settings, db)
    yield folders
    folders.close()


def test_a_start_deletes_dead_servers_folders_whole_and_keeps_live_ones(servers):
    """A server killed with SIGKILL (its lease still live) and servers elsewhere whose lease ran out, or who never
    took one, are dead: a third server's start deletes their folders whole, at once; a live server's folder (lease
    live elsewhere, or a running process here whatever its lease) is left as it is."""
    from app.runtime import upload_cache_dir
    from app.services.operations.cache_sweep import sweep_at_start
    from app.services.operations.leader import ServerIdentity, this_process

    killed, killed_id = servers.local_process()
    running, running_id = servers.local_process()
    dead = [
        servers.folder(killed_id, "live"),
        servers.folder(ServerIdentity("elsewhere", 41, 1000.0), "expired"),
        servers.folder(ServerIdentity("elsewhere", 42, 1000.0), None),
    ]
    live = [servers.folder(ServerIdentity("elsewhere", 43, 1000.0), "live"), servers.folder(running_id, "expired")]
    killed.send_signal(signal.SIGKILL)
    assert killed.wait(10) == -signal.SIGKILL
    cache = upload_cache_dir(servers.settings)
    _file(cache / "tmpk2j3h4", b"DICM half an upload, single-folder layout")
    live_files = sorted(p for folder in live for p in folder.rglob("*"))

    report = sweep_at_start(servers.settings, servers.db, now=time.time())

    assert sorted(cache.iterdir()) == sorted(live)
    assert sorted(p for folder in live for p in folder.rglob("*")) == live_files
    assert report.cache_files == len(dead) + 1
    assert this_process().folder not in {p.name for p in cache.iterdir()}

    running.kill()
    running.wait(10)
    assert sweep_at_start(servers.settings, servers.db).cache_files == 1  # its process is gone: dead at once
    assert [p.name for p in cache.iterdir()] == [live[0].name]


def test_the_leaders_sweep_deletes_dead_folders_at_once_and_ages_out_live_ones(servers):
    from app.runtime import server_cache_dir
    from app.services.operations.cache_sweep import CACHE_MAX_AGE_S, sweep_stale
    from app.services.operations.export_downloads import DOWNLOAD_RETENTION_S, EXPORTS
    from app.services.operations.leader import ServerIdentity, this_process

    now = time.time()
    dead = servers.folder(ServerIdentity("elsewhere", 41, 1000.0), "expired")
    _aged(dead / "0a1b2c" / "Doe^John-1961.dcm", 60, now)  # a minute old: no hour's wait for a dead server
    other, me = ServerIdentity("elsewhere", 43, 1000.0), this_process()
    for identity in (other, me):
        folder = servers.folder(identity, "live" if identity is other else None)
        for path in (_file(folder / "9f8e" / "old-render.webp"), folder / "9f8e"):
            _aged(path, CACHE_MAX_AGE_S + 60, now)
        _aged(_file(folder / EXPORTS / ("b" * 32) / "orapo-fhir.zip"), DOWNLOAD_RETENTION_S + 60, now)
        _aged(folder / EXPORTS / ("b" * 32), DOWNLOAD_RETENTION_S + 60, now)
        _file(folder / EXPORTS / ("c" * 32) / "orapo-fhir.zip")

    report = sweep_stale(servers.settings, servers.db, me=me, now=now)

    assert not dead.exists()
    for identity in (other, me):
        folder = server_cache_dir(servers.settings, identity)
        assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
            "0a1b2c/Doe^John-1961.dcm",
            f"{EXPORTS}/{'c' * 32}/orapo-fhir.zip",
        ]
    assert (report.cache_files, report.exports) == (1 + 2, 2)
