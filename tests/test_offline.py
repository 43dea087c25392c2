"""No code path reaches the network: importing the package, running the CLI and starting the app.

Sockets are patched for the whole test: any connection or name lookup to a
non-loopback address is recorded (and refused), and the test fails if there is one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.dicom import pydicom_data_file

_GUARD = textwrap.dedent(
    """
    import ipaddress, socket, sys
    attempts = []
    def _is_local(host):
        if host in (None, "", "localhost") or str(host).startswith("/"):
            return True
        try:
            return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
        except ValueError:
            return False
    _connect = socket.socket.connect
    _connect_ex = socket.socket.connect_ex
    _getaddrinfo = socket.getaddrinfo
    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if not _is_local(host):
            attempts.append(("connect", host))
            raise OSError("outbound connection refused by test")
        return _connect(self, address)
    def connect_ex(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if not _is_local(host):
            attempts.append(("connect_ex", host))
            return 111
        return _connect_ex(self, address)
    def getaddrinfo(host, *a, **k):
        if not _is_local(host):
            attempts.append(("getaddrinfo", host))
            raise socket.gaierror("name lookup refused by test")
        return _getaddrinfo(host, *a, **k)
    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    socket.getaddrinfo = getaddrinfo
    """
)


def _run_guarded(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = _GUARD + textwrap.dedent(body) + "\nprint('ATTEMPTS', attempts)\nassert not attempts, attempts\n"
    env = {
        "PATH": "/usr/bin:/bin",
        "ORAPO_DATA_DIR": str(tmp_path / "data"),
        "OMP_NUM_THREADS": "1",
        "HOME": str(tmp_path),
    }
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_guard_itself_catches_an_outbound_connection(tmp_path: Path) -> None:
    # The guard must be able to fail: a deliberate connection to a public address is recorded.
    result = _run_guarded(
        """
        import socket
        s = socket.socket()
        try:
            s.connect(("192.0.2.1", 443))
        except OSError:
            pass
    """,
        tmp_path,
    )
    assert result.returncode != 0 and "('connect', '192.0.2.1')" in result.stdout


@pytest.mark.slow
def test_import_cli_and_app_open_no_outbound_connection(tmp_path: Path) -> None:
    dcm = pydicom_data_file("RG1_UNCI.dcm")
    csv_path = tmp_path / "reports.csv"
    csv_path.write_text("id,report\n1,No pleural effusion. Mild cardiomegaly.\n")
    result = _run_guarded(
        f"""
        import orapo_core, db, app
        from app.cli import main
        assert main(["ingest", {str(dcm)!r}, "--json"]) == 0
        assert main(["label", {str(csv_path)!r}, "-o", {str(tmp_path / "labels.csv")!r}]) == 0
        from orapo_core.config import Settings
        from app.runtime import open_database
        from app.server import build_app
        settings = Settings()
        demo = build_app(settings=settings, database=open_database(settings))
        demo.launch(server_name="127.0.0.1", server_port=0 or None, prevent_thread_lock=True, quiet=True)
        import urllib.request
        assert urllib.request.urlopen(demo.local_url, timeout=30).status == 200
        demo.close()
    """,
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ATTEMPTS []" in result.stdout
