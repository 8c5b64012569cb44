"""Credentials in a download URL never reach an error line or a lock file, and lock files
are readable by their owner only (they record the holder's command line)."""

from __future__ import annotations

import json
import socket
import stat
import sys

import pytest
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main
from spinn.ground.errors import redact
from spinn.ground.io import LOCK_NAME, OUTPUT_LOCK_SUFFIX, lock_folder, publishing

SECRET = "s3cr3t-token"
OWNER_ONLY = 0o600


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"https://user:{SECRET}@host/x.zip", "https://***@host/x.zip"),
        (f"from http://{SECRET}@10.0.0.1:8080/a; retry", "from http://***@10.0.0.1:8080/a; retry"),
        (f"spinn download --url s3://key:{SECRET}@bucket/x.zip", "spinn download --url s3://***@bucket/x.zip"),
        ("https://host/x.zip?user@example", "https://host/x.zip?user@example"),
        ("mail me at someone@example.com", "mail me at someone@example.com"),
        (
            f"https://b.s3.amazonaws.com/x.zip?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F2026"
            f"&X-Amz-Signature={SECRET}&X-Amz-Security-Token={SECRET}: 403",
            "https://b.s3.amazonaws.com/x.zip?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
            "&X-Amz-Signature=***&X-Amz-Security-Token=***: 403",
        ),
        (
            f"https://a.blob.core.windows.net/c/x.zip?sv=2024&sig={SECRET}",
            "https://a.blob.core.windows.net/c/x.zip?sv=2024&sig=***",
        ),
        (f"http://host/x.zip?token={SECRET}; retry", "http://host/x.zip?token=***; retry"),
        (f"https://u:{SECRET}@host/x?access_token={SECRET}#k", "https://***@host/x?access_token=***#k"),
        (f"https://host/cb#access_token={SECRET}&state=1", "https://host/cb#access_token=***&state=1"),
        ("https://host/x.zip?dl=1&version=2", "https://host/x.zip?dl=1&version=2"),
    ],
)
def test_credentials_in_a_url_are_redacted(text, shown):
    assert redact(text) == shown


def free_port() -> int:
    """A local port nothing listens on: a download from it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    ("where", "shown"), [(f"user:{SECRET}@", "***@127.0.0.1"), ("", "X-Amz-Signature=***&token=***")]
)
def test_a_failed_download_does_not_echo_its_credentials(where, shown, tmp_path):
    url = f"http://{where}127.0.0.1:{free_port()}/snli_1.0.zip"
    url += "" if where else f"?X-Amz-Signature={SECRET}&token={SECRET}"
    result = CliRunner().invoke(main, ["download", "--raw-dir", str(tmp_path), "--url", url])
    assert result.exit_code == EXIT_USER_ERROR, result.output
    assert result.stderr.startswith("error: ") and shown in result.stderr
    assert SECRET not in result.output + result.stderr


@pytest.mark.parametrize("store", ["sqlite", "server"])
def test_the_mlflow_store_lock_is_private_like_every_other_lock(store, tmp_path, monkeypatch):
    from spinn.tracking.store import store_lock, store_lock_path

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}" if store == "sqlite" else "http://127.0.0.1:1"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("SPINN_LOCK_DIR", str(tmp_path / "locks"))
    with store_lock():
        assert stat.S_IMODE(store_lock_path(uri).stat().st_mode) == OWNER_ONLY


@pytest.mark.parametrize("lock", ["folder", "output"])
def test_a_lock_file_is_private_and_records_no_credentials(lock, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["spinn", "download", "--url", f"https://user:{SECRET}@host/x.zip"])
    if lock == "folder":
        holding, path = lock_folder(tmp_path), tmp_path / LOCK_NAME
    else:
        holding, path = publishing((tmp_path / "x.zip",)), tmp_path / f".x.zip{OUTPUT_LOCK_SUFFIX}"
    with holding:
        assert stat.S_IMODE(path.stat().st_mode) == OWNER_ONLY
        command = json.loads(path.read_text())["command"]
    assert command == "spinn download --url https://***@host/x.zip"


def test_a_flow_request_refuses_a_url_with_credentials_naming_the_variable(tmp_path):
    """Flow parameters land in Prefect's database: credentials come from SPINN_DOWNLOAD_URL only."""
    from pydantic import ValidationError

    from flows.flow_requests import CorpusRequest

    with pytest.raises(ValidationError, match="SPINN_DOWNLOAD_URL") as refused:
        CorpusRequest(params=None, data_dir=tmp_path, download={"url": "https://user:token@example.org/snli.zip"})
    assert "token" not in str(refused.value)
    plain = CorpusRequest(params=None, data_dir=tmp_path, download={"url": "https://example.org/snli.zip"})
    assert plain.stages().download.url == "https://example.org/snli.zip"
