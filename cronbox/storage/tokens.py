"""Signed, short-lived download tokens (the `<token>` of `/files/<token>`).

itsdangerous, set up the way its own docs recommend and not the way its
defaults are: SHA-256 (the default digest is SHA-1), one salt per purpose (a
token made for another purpose with the same keys does not verify here), and
the list of signing keys oldest to newest, so links issued before a key
rotation keep working until they expire.

The payload carries only opaque values: the grant id, a random token id (jti)
and the token's own expiry (exp). Verification is `loads(max_age=<longest TTL
allowed>)`, then `exp`: max_age bounds every token even if exp were wrong,
exp gives each its own TTL. itsdangerous reports a timestamp in the future as
"expired" too; that is told apart here, because a future-dated token is a
forgery or a broken clock (404), not an expired link (410).

Signatures are base64: several strings decode to the same signature bytes, so
a token's text is not unique. Anything counted (uses of a grant) is counted on
the jti, never on the text.
"""
from __future__ import annotations

import calendar
import hashlib
import re
import secrets
from dataclasses import dataclass

from itsdangerous import BadPayload, BadSignature, SignatureExpired, TimestampSigner, URLSafeTimedSerializer

from cronbox.outbox.core import clock

SALT_DOWNLOAD = "cronbox.files.download.v1"
MAX_TOKEN_LENGTH = 512
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-.]+")  # matched whole (fullmatch: `$` takes a final newline)
_GRANT_ID = re.compile(r"[0-9a-f]{32}")


def now_epoch() -> int:
    return calendar.timegm(clock.utcnow().utctimetuple())


class _ClockSigner(TimestampSigner):
    """itsdangerous reads time.time(); cronbox's clock is the one tests can freeze."""

    def get_timestamp(self) -> int:
        return now_epoch()


@dataclass(frozen=True)
class Claims:
    grant_id: str
    jti: str
    exp: int  # epoch seconds


class TokenRefused(Exception):
    """The token does not open a download. `expired` is True only for an authentic, expired token."""

    def __init__(self, reason: str, *, expired: bool = False, claims: Claims | None = None):
        super().__init__(reason)
        self.reason = reason
        self.expired = expired
        self.claims = claims


class Tokens:
    def __init__(self, signing_keys: list[bytes], *, max_ttl: int, salt: str = SALT_DOWNLOAD):
        if not signing_keys:
            raise ValueError("at least one signing key is needed")
        self.max_ttl = max_ttl
        self._serializer = URLSafeTimedSerializer(
            signing_keys, salt=salt, signer=_ClockSigner, signer_kwargs={"digest_method": hashlib.sha256})

    def issue(self, grant_id: str, ttl: int) -> tuple[str, Claims]:
        if not 1 <= ttl <= self.max_ttl:
            raise ValueError(f"ttl must be 1 to {self.max_ttl} seconds")
        claims = Claims(grant_id, secrets.token_urlsafe(16), now_epoch() + int(ttl))
        token = self._serializer.dumps({"g": claims.grant_id, "j": claims.jti, "e": claims.exp})
        return token, claims

    def verify(self, token: str) -> Claims:
        if not token or len(token) > MAX_TOKEN_LENGTH or not _TOKEN_CHARS.fullmatch(token):
            raise TokenRefused("malformed")
        try:
            payload, signed_at = self._serializer.loads(token, max_age=self.max_ttl, return_timestamp=True)
        except SignatureExpired as exc:
            # Authentic (the signature checked out) but outside [now - max_ttl, now].
            if exc.date_signed is not None and exc.date_signed.timestamp() > now_epoch():
                raise TokenRefused("future-dated") from None
            raise TokenRefused("expired", expired=True, claims=self._expired_claims(exc.payload)) from None
        except BadSignature:
            raise TokenRefused("bad-signature") from None
        claims = _claims(payload)
        if claims is None:
            raise TokenRefused("bad-payload")
        issued = int(signed_at.timestamp())
        if not issued < claims.exp <= issued + self.max_ttl:
            raise TokenRefused("bad-payload")
        if now_epoch() >= claims.exp:
            raise TokenRefused("expired", expired=True, claims=claims)
        return claims

    def _expired_claims(self, raw) -> Claims | None:
        """The claims of a token whose signature verified but whose age is past max_ttl (for the audit)."""
        try:
            return _claims(self._serializer.load_payload(raw))
        except BadPayload:
            return None


def _claims(payload) -> Claims | None:
    """Claims from a verified payload, or None when its shape is not ours."""
    if not isinstance(payload, dict) or set(payload) != {"g", "j", "e"}:
        return None
    grant_id, jti, exp = payload["g"], payload["j"], payload["e"]
    if not (isinstance(grant_id, str) and _GRANT_ID.fullmatch(grant_id) and isinstance(jti, str) and 0 < len(jti) <= 64
            and isinstance(exp, int) and not isinstance(exp, bool)):
        return None
    return Claims(grant_id, jti, exp)
