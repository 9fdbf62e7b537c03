"""Helpers shared by the storage tests."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from cronbox.outbox.core.transactions import in_transaction
from cronbox import storage
from cronbox.storage.format import CHUNK_SIZE, SEALED_CHUNK
from cronbox.storage.models import SealedFile


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


def flip_byte(st, file_id: str, size: int, *, chunk: int, offset: int, mask: int) -> None:
    """XOR one byte of sealed chunk `chunk` (of a file of `size` plaintext bytes, whole chunks) on disk;
    the same call again restores it."""
    path = sealed_path(st, file_id)
    raw = bytearray(path.read_bytes())
    header = len(raw) - size - (size // CHUNK_SIZE) * 16  # each chunk carries a 16-byte tag
    raw[header + chunk * SEALED_CHUNK + offset] ^= mask
    path.write_bytes(bytes(raw))


def files_under(folder: Path):
    for root, _dirs, names in os.walk(folder):
        for name in names:
            yield Path(root) / name


@pytest.fixture
def store(runtime):
    """The process's Storage on this test's database and instance folder (migrated)."""
    return storage.configure(runtime.settings, runtime.sessions)
