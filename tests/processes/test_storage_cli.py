"""`python -m cronbox storage ...` through real processes: the happy path, one-line errors, unsafe keys."""
from __future__ import annotations

import os

import pytest

from app import create_app
from cronbox.outbox.core.settings import load_settings
from cronbox.storage.errors import KeyFolderError
from tests.conftest import run_cli
from tests.processes.test_cli import one_line_error

# The storage commands' arguments and output: sealed storage on PostgreSQL runs in test_storage_api,
# test_storage_http and test_storage_hardening, so not here too (.ci/run's 30 minutes).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")


def ok(env, *args, **extra):
    proc = run_cli(env, "storage", *args, **extra)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout.strip()


def test_put_grant_url_revoke_verify_audit_sweep(env, runtime, tmp_path):
    source = tmp_path / "Jane Doe scan.pdf"
    source.write_bytes(b"%PDF-1.7 " + os.urandom(70000))
    first = run_cli(env, "storage", "put", str(source), "--owner", "patient:1")
    assert "BACK IT UP NOW" in first.stderr  # keys made on first use, loudly
    file_id = first.stdout.strip()
    assert len(file_id) == 32
    grant_id = ok(env, "grant", file_id, "--subject", "user:7", "--expires-in", "2h", "--max-uses", "3")
    link = ok(env, "url", grant_id, "--ttl", "10m")
    assert link.startswith("/files/") and "." in link
    assert ok(env, "verify", file_id).endswith("verify: 1 checked, 0 failed")
    assert "no integrity errors recorded" in ok(env, "verify")
    keys = ok(env, "keys")
    assert "encryption" in keys and "active" in keys and "signs" in keys
    audit = ok(env, "audit", "--file", file_id)
    for action in ("put", "grant", "issue", "verify"):
        assert action in audit
    assert "Jane" not in audit
    assert ok(env, "revoke", grant_id) == f"revoke: grant {grant_id} revoked"
    assert ok(env, "revoke", grant_id) == f"revoke: grant {grant_id} was already revoked"
    assert "0 orphaned" in ok(env, "sweep")
    assert ok(env, "new-key").startswith("new-key: enc-0002-")
    assert "rewrap: done, 1 re-wrapped under enc-0002-" in ok(env, "rewrap")


def test_url_absolute_is_on_the_base_url_and_a_clear_error_without_it(env, runtime, tmp_path):
    source = tmp_path / "scan.pdf"
    source.write_bytes(b"%PDF-1.7 scan")
    grant_id = ok(env, "grant", ok(env, "put", str(source), "--owner", "patient:1"), "--subject", "user:7")
    proc = run_cli(env, "storage", "url", grant_id, "--absolute")
    assert proc.returncode == 1 and "needs CRONBOX_BASE_URL" in one_line_error(proc)
    link = ok(env, "url", grant_id, "--absolute", CRONBOX_BASE_URL="https://host.example/app/")
    assert link.startswith("https://host.example/app/files/") and "\n" not in link
    proc = run_cli(env, "storage", "url", grant_id, "--absolute", CRONBOX_BASE_URL="host.example")
    assert proc.returncode == 1 and one_line_error(proc).startswith("error: CRONBOX_BASE_URL='host.example' must be")


@pytest.mark.parametrize("args, code, message", [
    (["grant", "0" * 32, "--subject", "u"], 1, f"no file {'0' * 32}"),
    (["grant", "x", "--subject", "u", "--expires-in", "soon"], 2, "is not a duration"),
    (["grant", "x"], 2, "Missing option '--subject'"),
    (["revoke", "nope"], 1, "no grant nope"),
    (["url", "f" * 32], 1, f"no grant {'f' * 32}"),
    (["url", "f" * 32, "--ttl", "2h"], 2, "must be 1s to 3600s"),
    (["verify", "a" * 32, "--all"], 2, "give a file id or --all"),
    (["verify", "abc"], 2, "'abc' is not a file id (32 hex digits)"),
    (["verify", "a" * 32], 1, f"unknown file id(s): {'a' * 32}"),
    (["put", "/no/such/file", "--owner", "p"], 2, "does not exist"),
    (["put", "/etc/hostname"], 2, "Missing option '--owner'"),
    (["rewrap", "--batch-size", "0"], 2, "not in the range"),
])
def test_mistakes_give_one_line(env, runtime, args, code, message):
    proc = run_cli(env, "storage", *args)
    assert proc.returncode == code, proc.stderr
    assert message in one_line_error(proc)


def test_a_key_readable_by_others_stops_commands_and_the_app(env, runtime, tmp_path):
    ok(env, "keys")
    key_folder = tmp_path / "instance" / "keys"
    key_file = next(key_folder.glob("enc-*.key"))
    key_file.chmod(0o644)
    proc = run_cli(env, "storage", "keys")
    assert proc.returncode == 1 and "accessible to group or others" in one_line_error(proc)
    with pytest.raises(KeyFolderError, match="chmod 600"):
        create_app(load_settings(environ=env))
    key_file.chmod(0o600)
    key_folder.chmod(0o755)
    with pytest.raises(KeyFolderError, match="chmod 700"):
        create_app(load_settings(environ=env))


def test_keys_inside_the_web_root_are_refused(env, runtime, tmp_path):
    inside = {**env, "CRONBOX_WEB_ROOT": str(tmp_path)}
    proc = run_cli(inside, "storage", "keys")
    assert proc.returncode == 1 and "inside the web root" in one_line_error(proc)
    with pytest.raises(KeyFolderError, match="inside the web root"):
        create_app(load_settings(environ=inside))
    outside = {**env, "CRONBOX_KEYS": str(tmp_path / "elsewhere" / "keys"),
               "CRONBOX_WEB_ROOT": str(tmp_path / "instance" / "public")}
    assert "key folder: " + str(tmp_path / "elsewhere" / "keys") in ok(outside, "keys")
