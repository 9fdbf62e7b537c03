"""Payloads are plain JSON; anything else is refused before a row is written.

Refusing at record()/dispatch() time, in the caller's request, is the only place
the mistake is cheap: a datetime discovered by the relay at 3 a.m. is a dead
delivery nobody can fix. The error names the offending key path.
"""
from __future__ import annotations

import json
import math

from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.core.text import is_utf8

_ALLOWED = "str, int, float, bool, None, list, dict with str keys"
# One encoder for every call: json.dumps() with options builds a new JSONEncoder each time.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dump_payload(payload) -> str:
    if not _is_json(payload):
        _check(payload, "payload")  # raises, naming the offending key path
    body = _ENCODER.encode(payload)
    if not is_utf8(body):  # a lone surrogate somewhere: find it for the message
        _check(payload, "payload")
    return body


def payload_bytes(body: str) -> int:
    """The size of a dumped payload in UTF-8 bytes, stored beside it: what a claim that takes it
    reads and holds (outbox.engine.claim bounds a batch by the sum). An ASCII body (most are) is
    its length; the flag is kept on the string, so asking costs nothing."""
    return len(body) if body.isascii() else len(body.encode("utf-8"))


def _is_json(value) -> bool:
    """_check's test without the key paths it formats for its message (every record() and dispatch()
    passes here; only a refused payload needs the path)."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_is_json(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _is_json(item) for key, item in value.items())
    return False


def load_payload(text: str):
    return json.loads(text)


def _check(value, path: str) -> None:
    if isinstance(value, str):
        if not is_utf8(value):
            raise PayloadError(f"{path} is not UTF-8 text (a lone surrogate, as os.fsdecode leaves of bytes "
                               "that were not UTF-8)")
        return
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{path} is {value!r}: JSON has no NaN or infinity")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"{path} has a key {key!r} of type {type(key).__name__}: JSON keys are str")
            if not is_utf8(key):
                raise PayloadError(f"{path} has a key {key!r} that is not UTF-8 text (a lone surrogate)")
            _check(item, f"{path}[{key!r}]")
        return
    raise PayloadError(f"{path} is a {type(value).__name__}, not JSON ({_ALLOWED})")
