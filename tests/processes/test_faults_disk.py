"""A full disk (ENOSPC from a small tmpfs the test mounts) under sealing and under log writes.

Mounting needs root, which CI has. Elsewhere these tests are skipped with the reason shown in the
summary, except with CI=1, where a skip would hide a gap and fails instead.
"""
from __future__ import annotations

import errno
import io
import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select

from cronbox.storage.format import CHUNK_SIZE
from cronbox.storage.models import SealedFile
from tests.conftest import ONE_MYSQL_MODE, run_cli
from tests.handlers.effects import metadata as effects_metadata
from tests.helpers import deliveries
from tests.storage_helpers import files_under, put, read, store  # noqa: F401  (store is a fixture)
from tests.web.test_storage_http import AUTH, checked, make_app
from tests.processes.test_tick import record

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)  # the claim mode changes nothing here


@pytest.fixture
def tmpfs():
    """mount(folder, size): a size-limited tmpfs on `folder`, unmounted after the test."""
    def unavailable(message: str):
        if os.environ.get("CI") == "1":
            pytest.fail(f"CI=1: {message}")
        pytest.skip(f"disk-full tests skipped: {message}")

    if os.geteuid() != 0:
        unavailable("mounting a size-limited tmpfs needs root (CI runs as root)")
    mounted = []

    def mount(folder: Path, size: str) -> Path:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            unavailable(f"mount -t tmpfs failed: {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> None:
    """Take every free byte left in `folder`'s file system."""
    with open(folder / "filler", "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def sealed_rows(st) -> list[str]:
    with st.sessions() as session:
        return sorted(session.scalars(select(SealedFile.id)))


def leftovers(st, keep: set[str]) -> list[Path]:
    """Files under the private folder that are neither the kept sealed files nor the filler."""
    return [p for p in files_under(st.settings.sealed_dir)
            if p.name != "filler" and p.name.split(".")[0] not in keep]


@pytest.fixture
def small_disk(store, tmpfs):  # noqa: F811
    """The private-files folder on a 1 MiB disk, one file already sealed on it (it must stay readable)."""
    tmpfs(store.settings.sealed_dir, "1m")
    earlier = os.urandom(3 * CHUNK_SIZE)
    return put(store, earlier), earlier


@pytest.mark.parametrize("size", [2 * 1024 * 1024, 5 * CHUNK_SIZE + 7])
def test_storage_put_on_a_full_disk_fails_cleanly_and_leaves_nothing(store, small_disk, size):  # noqa: F811
    earlier_id, earlier = small_disk
    if size < 2 * 1024 * 1024:
        fill(store.settings.sealed_dir)  # no room left even for a small file
    with pytest.raises(OSError) as raised:
        put(store, os.urandom(size))
    assert raised.value.errno == errno.ENOSPC
    assert sealed_rows(store) == [earlier_id]
    assert leftovers(store, {earlier_id}) == []  # no partial sealed or temporary file stays
    assert read(store, earlier_id) == earlier


def test_storage_put_command_on_a_full_disk_is_one_line_and_leaves_nothing(env, store, small_disk,  # noqa: F811
                                                                          tmp_path):
    earlier_id, earlier = small_disk
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(2 * 1024 * 1024))
    proc = run_cli(env, "storage", "put", str(source), "--owner", "patient:4")
    assert proc.returncode == 1 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: disk full") and "No space left on device" in line and "internal" not in line
    assert sealed_rows(store) == [earlier_id] and leftovers(store, {earlier_id}) == []
    assert read(store, earlier_id) == earlier


@pytest.mark.parametrize("form", [False, True], ids=["raw-body", "multipart"])
def test_an_upload_on_a_full_disk_is_a_507_and_leaves_nothing(runtime, env, store, small_disk, form):  # noqa: F811
    earlier_id, earlier = small_disk
    application = make_app(env)
    try:
        client = application.test_client()
        body = os.urandom(2 * 1024 * 1024)
        if form:
            response = client.post("/files", headers=AUTH, content_type="multipart/form-data",
                                   data={"owner": "patient:3", "file": (io.BytesIO(body), "scan.png", "image/png")})
        else:
            response = client.post("/files", data=body, headers={**AUTH, "X-Cronbox-Owner": "patient:3"})
        checked(response)
        assert response.status_code == 507, response.get_data(as_text=True)
        assert "space" in response.json["error"]
    finally:
        application.extensions["cronbox"].runtime.dispose()
    assert sealed_rows(store) == [earlier_id]
    assert leftovers(store, {earlier_id}) == []
    assert read(store, earlier_id) == earlier


def test_a_tick_with_its_log_folder_full_still_delivers_and_says_so_once(runtime, env, tmpfs, tmp_path):
    effects_metadata.create_all(runtime.engine)
    fill(tmpfs(runtime.settings.logs_dir, "64k"))
    ids = record(runtime, "work", 5) + record(runtime, "ping", 3)
    proc = run_cli({**env, "CRONBOX_HANDLERS": "tests.handlers.effects",
                    "TEST_EFFECTS_FILE": str(tmp_path / "effects.txt")}, "tick", "--no-linger")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "delivered 13" in proc.stdout  # 5 events x 2 consumers + 3
    assert "Logging error" not in proc.stderr and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert "cannot write the log" in line and "No space left on device" in line
    assert len(deliveries(runtime)) == 13 and {d.status for d in deliveries(runtime)} == {"done"}
    assert (tmp_path / "effects.txt").read_text().split() == [str(i) for i in ids[:5]]
