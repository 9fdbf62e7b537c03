"""Tables of sealed storage: files, grants, per-token uses, and the audit trail.

Ids of files and grants are random (16 bytes, 32 hex characters), made before
the row exists, and opaque: they appear in signed URLs and say nothing about
patients or counts. Nothing here is PHI in clear: file names and content types
are sealed in `meta`, and `owner` / `subject` are expected to be opaque
references (`patient:1842`, `user:17`), never names.

Retention (enforced by `storage sweep`):
- files: kept until the application deletes them (they are the records);
- grants and their use rows: deleted 30 days after they expired or were revoked;
- audit entries: kept CRONBOX_AUDIT_RETENTION (default 2192 days, six years,
  the HIPAA documentation period), then deleted oldest first.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from cronbox.outbox.core.models import Base, ExactString, Id, UtcDateTime
from cronbox.outbox.core.text import NAME_MAX

FileId = ExactString(32)  # random hex, but compared as an identity all the same


class SealedFile(Base):
    """One sealed file: its owner, sizes, sealed name and type, and its data key wrapped by a master key;
    the ciphertext is `<instance>/private/<first two characters of id>/<id>.sealed` (docs/sealed-format.md,
    "Database row")."""

    __tablename__ = "cronbox_files"

    id: Mapped[str] = mapped_column(FileId, primary_key=True)
    owner: Mapped[str] = mapped_column(ExactString(NAME_MAX))
    # Payload algorithm (also in the sealed header): "aes-256-gcm" or "xchacha20-poly1305".
    algorithm: Mapped[str] = mapped_column(String(24))
    # The master key that wraps this file's data key; rewrap changes both columns in one UPDATE.
    key_id: Mapped[str] = mapped_column(ExactString(32))
    wrapped_key: Mapped[bytes] = mapped_column(LargeBinary)
    # Sealed {"name", "type"} of the original upload (docs/sealed-format.md, "Sealed metadata").
    meta: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(BigInteger)  # plaintext bytes
    sealed_size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # Set when a download or `storage verify` finds the file altered or missing; cleared by a clean verify.
    integrity_error: Mapped[str | None] = mapped_column(String(255))
    checked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "key_id", "id"), Index(None, "owner"))


class Grant(Base):
    """Permission for `subject` to download one file until `expires_at`, at most `max_uses` times."""

    __tablename__ = "cronbox_grants"

    id: Mapped[str] = mapped_column(FileId, primary_key=True)
    file_id: Mapped[str] = mapped_column(FileId, ForeignKey("cronbox_files.id"))
    subject: Mapped[str] = mapped_column(ExactString(NAME_MAX))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)
    max_uses: Mapped[int | None] = mapped_column(Integer)
    uses: Mapped[int] = mapped_column(Integer, default=0)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    # The console lists grants newest first, all or by subject (a file's grants are few).
    __table_args__ = (Index(None, "file_id"), Index(None, "expires_at"), Index(None, "created_at"),
                      Index(None, "subject", "created_at"))


class GrantUse(Base):
    """One counted use of a grant, per signed-URL token id (jti), never per token text.

    Signatures are malleable (several strings verify as one token), so the
    token's random jti is the unit, per client: requests with the same jti from
    the same client within a short window from the use's first request
    (`first_at`; resumed downloads, range requests) are the same use. The jti and
    client are stored only hashed together (`jti_hash`: storage.grants.use_key_for).
    """

    __tablename__ = "cronbox_grant_uses"

    grant_id: Mapped[str] = mapped_column(FileId, ForeignKey("cronbox_grants.id"), primary_key=True)
    jti_hash: Mapped[str] = mapped_column(ExactString(32), primary_key=True)
    first_at: Mapped[datetime] = mapped_column(UtcDateTime)
    last_at: Mapped[datetime] = mapped_column(UtcDateTime)
    requests: Mapped[int] = mapped_column(Integer, default=1)


class AuditEntry(Base):
    """Append-only: every upload, grant, revoke, link issued and download attempt, with its outcome.

    Rows are only ever inserted (and deleted by retention). A download writes
    one row when it is decided (granted, with the range promised, or refused
    with the reason) and one when the body ends (bytes actually sent).
    """

    __tablename__ = "cronbox_file_audit"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime)
    action: Mapped[str] = mapped_column(String(16))  # put, grant, revoke, issue, redeem, serve, verify, show-name
    outcome: Mapped[str] = mapped_column(String(32))  # ok / granted / a refusal reason
    status: Mapped[int | None] = mapped_column(Integer)  # HTTP status, for redemptions
    file_id: Mapped[str | None] = mapped_column(FileId)
    grant_id: Mapped[str | None] = mapped_column(FileId)
    subject: Mapped[str | None] = mapped_column(ExactString(NAME_MAX))
    jti_hash: Mapped[str | None] = mapped_column(ExactString(32))
    range_start: Mapped[int | None] = mapped_column(BigInteger)
    range_end: Mapped[int | None] = mapped_column(BigInteger)  # inclusive, as in Content-Range
    bytes_sent: Mapped[int | None] = mapped_column(BigInteger)
    client_ip: Mapped[str | None] = mapped_column(String(45))
    user_agent: Mapped[str | None] = mapped_column(String(255))
    detail: Mapped[str | None] = mapped_column(String(255))

    # The console filters by file, subject and outcome, newest first (keyset pages on id).
    __table_args__ = (Index(None, "at"), Index(None, "file_id", "at"), Index(None, "file_id", "id"),
                      Index(None, "subject", "id"), Index(None, "outcome", "id"))
