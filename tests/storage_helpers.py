"""Helpers shared by the storage tests."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import storage
from outbox.db import in_transaction
from storage.models import SealedFile


def put(st, data: bytes, *, name: str = "scan.pdf", content_type: str = "application/pdf",
        owner: str = "patient:1") -> str:
    return in_transaction(st.sessions, lambda s: st.put(s, io.BytesIO(data), filename=name,
                                                        content_type=content_type, owner=owner))


def row(st, file_id: str) -> SealedFile:
    with st.sessions() as session:
        return session.get(SealedFile, file_id)


def read(st, file_id: str) -> bytes:
    with st.sessions() as session:
        opened = storage.open_file(session, file_id)
    try:
        return b"".join(bytes(part) for part in opened.iter_range(0, opened.size))
    finally:
        opened.close()


def grant(st, file_id: str, **kwargs) -> str:
    return in_transaction(st.sessions, lambda s: st.grant(s, file_id, "user:7", **kwargs))


def sealed_path(st, file_id: str) -> Path:
    return st.vault.path(file_id)


def files_under(folder: Path):
    for root, _dirs, names in os.walk(folder):
        for name in names:
            yield Path(root) / name


@pytest.fixture
def store(runtime):
    """The process's Storage on this test's database and instance folder (migrated)."""
    return storage.configure(runtime.settings, runtime.sessions)
