"""`orapo pacs listen`: a C-STORE SCP on 127.0.0.1 that ingests what pynetdicom's SCU (and Orthanc's "send to
modality") push, de-identified; refusals are failure statuses, other storage classes are turned down."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pydicom
import pytest

from tests.support.app import free_port
from tests.support.orthanc import phantom_dicoms

pytestmark = pytest.mark.slow  # live servers


@pytest.fixture
def node(data_dir):
    """The listener on a free local port with the CLI's database, and what it reported, stopped afterwards."""
    from app.runtime import open_database
    from app.services.archive.dimse import start_listener
    from orapo_core.config import Settings

    settings = Settings()
    db = open_database(settings)
    port, received = free_port(), []
    server = start_listener(
        db=db,
        settings=settings,
        port=port,
        ae_title="ORAPO",
        allowed_calling=["MODALITY", "ORTHANC"],
        on_receive=received.append,
        block=False,
    )
    yield type("Node", (), dict(port=port, db=db, received=received, data_dir=data_dir))
    server.shutdown()


def _associate(port: int, calling: str = "MODALITY", called: str = "ORAPO", contexts=None):
    """pynetdicom's SCU, asking for CR storage and verification unless given other contexts."""
    from pynetdicom import AE, build_context
    from pynetdicom.sop_class import ComputedRadiographyImageStorage, Verification

    ae = AE(ae_title=calling)
    ae.requested_contexts = contexts or [build_context(ComputedRadiographyImageStorage), build_context(Verification)]
    return ae.associate("127.0.0.1", port, ae_title=called)


def test_pushed_images_are_ingested_de_identified(node, tmp_path) -> None:
    from db import StudyRepository

    sent = phantom_dicoms(tmp_path, 2, seed=8101)
    assoc = _associate(node.port)
    assert assoc.is_established
    try:
        assert assoc.send_c_echo().Status == 0x0000
        for data, _ in sent + sent[:1]:  # the first one twice: a duplicate is a success, stored once
            status = assoc.send_c_store(pydicom.dcmread(io.BytesIO(data)))
            assert status.Status == 0x0000
        # A damaged image: its stated size does not match its pixels; the status says so, nothing is stored.
        broken = pydicom.dcmread(io.BytesIO(sent[1][0]))
        broken.SOPInstanceUID = broken.file_meta.MediaStorageSOPInstanceUID = "1.2.3.4.5.6.7"
        broken.PixelData = broken.PixelData[: len(broken.PixelData) // 3]
        status = assoc.send_c_store(broken)
        assert status.Status == 0xC000 and status.ErrorComment in (
            "dimension_mismatch",
            "truncated_file",
            "undecodable_pixels",
        )
    finally:
        assoc.release()

    assert [(r.calling_ae, r.outcome.ok, r.outcome.duplicate) for r in node.received] == [
        ("MODALITY", True, False),
        ("MODALITY", True, False),
        ("MODALITY", True, True),
        ("MODALITY", False, False),
    ]
    assert len(StudyRepository(node.db).list(limit=10)) == 2
    stored = b"".join(p.read_bytes() for p in sorted(node.data_dir.rglob("*")) if p.is_file())
    for data, who in sent:
        original = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
        for secret in (
            who["PatientName"],
            who["PatientID"],
            who["AccessionNumber"],
            who["InstitutionName"],
            who["ReferringPhysicianName"],
            str(original.StudyInstanceUID),
            str(original.SOPInstanceUID),
        ):
            assert secret.encode() in data and secret.encode() not in stored, secret


def test_only_chest_radiographs_from_known_senders_to_our_title(node, tmp_path) -> None:
    from pynetdicom import build_context
    from pynetdicom.sop_class import ComprehensiveSRStorage, CTImageStorage

    assoc = _associate(node.port, contexts=[build_context(CTImageStorage), build_context(ComprehensiveSRStorage)])
    assert not assoc.is_established or not assoc.accepted_contexts  # nothing to talk about
    if assoc.is_established:
        assoc.release()
    assert not _associate(node.port, called="SOMEONE_ELSE").is_established
    assert not _associate(node.port, calling="STRANGER").is_established
    assert node.received == []


def test_orapo_pacs_listen_runs_until_stopped(data_dir, tmp_path) -> None:
    port = free_port()
    env = dict(os.environ, ORAPO_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "pacs", "listen", "--port", str(port), "--ae-title", "ORAPO", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert "listening as ORAPO" in proc.stdout.readline()
        ((data, _),) = phantom_dicoms(tmp_path, 1, seed=8102)
        assoc = _associate(port)
        assert assoc.is_established and assoc.send_c_store(pydicom.dcmread(io.BytesIO(data))).Status == 0x0000
        assoc.release()
        line = json.loads(proc.stdout.readline())
        assert line["ok"] and line["calling_ae"] == "MODALITY" and line["study_id"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip().endswith("stopped")


def test_orthanc_sends_to_the_listener_as_to_a_modality(orthanc, node, tmp_path) -> None:
    """Orthanc's "send to modality" (its own C-STORE SCU) pushes a study it holds."""
    from db import StudyRepository

    ((data, who),) = phantom_dicoms(tmp_path, 1, seed=8103)
    original = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
    instance = orthanc.upload(data)["ID"]
    name = f"orapo-test-{node.port}"
    orthanc.json("PUT", f"modalities/{name}", {"AET": "ORAPO", "Host": "127.0.0.1", "Port": node.port})
    try:
        orthanc.json("POST", f"modalities/{name}/store", {"Resources": [instance], "Synchronous": True})
        deadline = time.monotonic() + 30
        while not node.received and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        orthanc.json("DELETE", f"modalities/{name}")
        orthanc.delete_study(str(original.StudyInstanceUID))
    ((received),) = node.received
    assert received.calling_ae == "ORTHANC" and received.outcome.ok
    assert len(StudyRepository(node.db).list(limit=10)) == 1
    # The study remembers, sealed, the archive study it came from, so its signed report can be filed there.
    from db import ArchiveLinkRepository
    from orapo_core.config import Settings
    from orapo_core.imaging.deid import unseal_archive_uid

    sealed = ArchiveLinkRepository(node.db).sealed(received.outcome.study_id)
    assert unseal_archive_uid(Settings().secret(), sealed) == str(original.StudyInstanceUID)
    stored = b"".join(p.read_bytes() for p in sorted(node.data_dir.rglob("*")) if p.is_file())
    assert who["PatientName"].encode() not in stored and str(original.StudyInstanceUID).encode() not in stored
