"""Deterministic test vectors for docs/sealed-format.md and tests/vectors/sealed_v1.json.

    python tests/vectors/make_vectors.py     # rewrites both; tests check they stay in sync

Every input that is random in production (data key, nonce prefix, wrap and
metadata nonces) is fixed here, so an independent implementation can
reproduce each byte. Must-fail variants are described as operations on the
sealed bytes (flip a bit, cut, append, duplicate a chunk) to keep the fixture small.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from storage import ciphers  # noqa: E402
from storage.format import (  # noqa: E402
    CHUNK_SIZE,
    SEALED_CHUNK,
    Sealer,
    header_size,
    metadata_key,
    payload_key,
    seal_meta,
    wrap_key,
)

FIXTURE = ROOT / "tests" / "vectors" / "sealed_v1.json"
SPEC = ROOT / "docs" / "sealed-format.md"

INPUTS = {
    "master_key": bytes(range(0x00, 0x20)).hex(),
    "key_id": "enc-0001-0a0b0c0d",
    "file_id": "00112233445566778899aabbccddeeff",
    "data_key": bytes(range(0x40, 0x60)).hex(),
    "nonce_prefix": {"aes-256-gcm": bytes(range(0xa0, 0xa7)).hex(),
                     "xchacha20-poly1305": bytes(range(0xb0, 0xc3)).hex()},
    "wrap_nonce": bytes(range(0xc0, 0xd8)).hex(),
    "meta_nonce": bytes(range(0xd0, 0xe8)).hex(),
    "name": "Résultat – scan 1.pdf",
    "type": "application/pdf",
}

PLAINTEXTS = {
    "empty": b"",
    "short": b"cronbox sealed v1\n",
    "two-chunks": bytes(k % 251 for k in range(CHUNK_SIZE + 17)),
}


def _variants(name: str, algorithm: str) -> list[dict]:
    """Changes to the sealed bytes that a reader MUST reject."""
    h = header_size(ciphers.CODES[algorithm])
    common = [
        {"op": "flip", "byte": 0, "bit": 0, "why": "magic"},
        {"op": "flip", "byte": 8, "bit": 1, "why": "algorithm byte"},
        {"op": "flip", "byte": 12, "bit": 7, "why": "file id"},
        {"op": "flip", "byte": h - 1, "bit": 0, "why": "nonce prefix"},
        {"op": "flip", "byte": -1, "bit": 0, "why": "last tag"},
        {"op": "truncate", "drop": 1, "why": "1 byte short"},
        {"op": "truncate", "drop": 16, "why": "16 bytes short"},
        {"op": "append", "hex": "00", "why": "appended byte"},
        {"op": "truncate-to", "length": h - 1, "why": "shorter than the header"},
    ]
    if name == "two-chunks":
        common += [
            {"op": "truncate-to", "length": h + SEALED_CHUNK, "why": "cut at a chunk boundary"},
            {"op": "flip", "byte": h + 100, "bit": 3, "why": "first chunk body"},
            {"op": "duplicate-chunk", "chunk": 0, "why": "first chunk repeated in place of the last"},
        ]
    return common


def build() -> dict:
    master_key = bytes.fromhex(INPUTS["master_key"])
    file_id = bytes.fromhex(INPUTS["file_id"])
    data_key = bytes.fromhex(INPUTS["data_key"])
    vectors = []
    for algorithm, prefix in INPUTS["nonce_prefix"].items():
        for name, plaintext in PLAINTEXTS.items():
            sink = io.BytesIO()
            sealer = Sealer(sink, file_id=file_id, data_key=data_key, algorithm=ciphers.CODES[algorithm],
                            nonce_prefix=bytes.fromhex(prefix))
            sealer.write(plaintext)
            sealer.finish()
            sealed = sink.getvalue()
            vectors.append({
                "name": f"{algorithm}/{name}",
                "algorithm": algorithm,
                "plaintext_length": len(plaintext),
                "plaintext_sha256": hashlib.sha256(plaintext).hexdigest(),
                "header": sealer.header.pack().hex(),
                "sealed_length": len(sealed),
                "sealed_sha256": hashlib.sha256(sealed).hexdigest(),
                "sealed_b64": base64.b64encode(sealed).decode(),
                "must_fail": _variants(name, algorithm),
            })
    return {
        "inputs": INPUTS,
        "derived": {
            "payload_key": payload_key(data_key, file_id).hex(),
            "metadata_key": metadata_key(data_key, file_id).hex(),
            "wrapped_key": wrap_key(master_key, INPUTS["key_id"], file_id, data_key,
                                    nonce=bytes.fromhex(INPUTS["wrap_nonce"])).hex(),
            "meta": seal_meta(data_key, file_id, INPUTS["name"], INPUTS["type"],
                              nonce=bytes.fromhex(INPUTS["meta_nonce"])).hex(),
        },
        "vectors": vectors,
    }


def plaintext_of(vector: dict) -> bytes:
    return PLAINTEXTS[vector["name"].split("/", 1)[1]]


def apply(sealed: bytes, variant: dict) -> bytes:
    data = bytearray(sealed)
    op = variant["op"]
    if op == "flip":
        data[variant["byte"]] ^= 1 << variant["bit"]
    elif op == "truncate":
        del data[len(data) - variant["drop"]:]
    elif op == "truncate-to":
        del data[variant["length"]:]
    elif op == "append":
        data += bytes.fromhex(variant["hex"])
    elif op == "duplicate-chunk":
        header = header_size(data[8])
        chunk = data[header + variant["chunk"] * SEALED_CHUNK: header + (variant["chunk"] + 1) * SEALED_CHUNK]
        data = data[: header + SEALED_CHUNK] + chunk
    else:
        raise ValueError(op)
    return bytes(data)


def _wrap(hex_text: str, width: int = 64) -> str:
    return "\n".join(hex_text[i:i + width] for i in range(0, len(hex_text), width))


def markdown(fixture: dict) -> str:
    inputs, derived = fixture["inputs"], fixture["derived"]
    lines = ["Inputs (hex unless quoted):", "", "```"]
    for key in ("master_key", "key_id", "file_id", "data_key", "wrap_nonce", "meta_nonce", "name", "type"):
        value = inputs[key]
        lines.append(f"{key:<14} {value if key not in ('key_id', 'name', 'type') else json.dumps(value, ensure_ascii=False)}")
    for algorithm, prefix in inputs["nonce_prefix"].items():
        lines.append(f"{'nonce_prefix':<14} {prefix}  ({algorithm})")
    lines += ["```", "", "Derived:", "", "```"]
    for key in ("payload_key", "metadata_key"):
        lines.append(f"{key:<13} {derived[key]}")
    lines.append("wrapped_key")
    lines.append(_wrap(derived["wrapped_key"]))
    lines.append("meta")
    lines.append(_wrap(derived["meta"]))
    lines += ["```", ""]
    for vector in fixture["vectors"]:
        sealed = base64.b64decode(vector["sealed_b64"])
        lines.append(f"**{vector['name']}**: {vector['plaintext_length']} plaintext bytes, "
                     f"{vector['sealed_length']} sealed bytes, SHA-256 of the sealed file `{vector['sealed_sha256']}`")
        lines += ["", "```", "header " + vector["header"]]
        if len(sealed) <= 256:
            lines.append("sealed")
            lines.append(_wrap(sealed.hex()))
        else:
            header = len(bytes.fromhex(vector["header"]))
            lines.append(f"chunk 0 tag   {sealed[header + SEALED_CHUNK - 16: header + SEALED_CHUNK].hex()}")
            lines.append(f"last chunk    {sealed[header + SEALED_CHUNK:].hex()}")
        lines += ["```", ""]
    lines.append("Each vector also lists *must-fail* variants (a flipped magic, algorithm, file-id, "
                 "nonce-prefix or tag bit; 1 and 16 bytes cut; a byte appended; the file cut inside its "
                 "header; for two chunks also a cut at the chunk boundary, a flipped bit in the first "
                 "chunk and the first chunk repeated as the last). A reader MUST reject every one.")
    return "\n".join(lines)


def write_spec_block(text: str) -> None:
    spec = SPEC.read_text(encoding="utf-8")
    block = f"<!-- vectors:begin -->\n{text}\n<!-- vectors:end -->"
    spec = re.sub(r"<!-- vectors:begin -->.*?<!-- vectors:end -->", lambda _m: block, spec, flags=re.S)
    SPEC.write_text(spec, encoding="utf-8")


def main() -> None:
    fixture = build()
    FIXTURE.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    write_spec_block(markdown(fixture))
    print(f"wrote {FIXTURE.relative_to(ROOT)} and the vectors block of {SPEC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
