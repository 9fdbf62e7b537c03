"""Deterministic test vectors for docs/sealed-format.md, tests/vectors/sealed_v1.json and the vectors' key file.

    python tests/vectors/make_vectors.py     # rewrites all three; tests check they stay in sync

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

from cronbox.storage import ciphers, keys  # noqa: E402
from cronbox.storage.format import (  # noqa: E402
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
KEY_FOLDER = ROOT / "tests" / "vectors" / "keys"  # a key folder as the spec describes it (a public test key)

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
PLAINTEXT_RULES = {
    "empty": "none",
    "short": 'the ASCII text "cronbox sealed v1" and LF',
    "two-chunks": "byte k is k mod 251",
}
SHOWN = 256  # sealed files up to this length are printed whole in the spec


def _variants(name: str, algorithm: str) -> list[dict]:
    """Changes to the sealed bytes that a reader MUST reject, and the reading step that rejects each
    (docs/sealed-format.md, "Reading"): header, length, last chunk, or chunk 0 (only when it is read).
    `does` says the operation in the spec's terms: H is the header length, S the sealed length."""
    h = header_size(ciphers.CODES[algorithm])

    def variant(does: str, why: str, detected_by: str, **op) -> dict:
        return {**op, "does": does, "why": why, "detected_by": detected_by}

    common = [
        variant("XOR byte 0 with 0x01", "the magic", "header", op="flip", byte=0, bit=0),
        variant("XOR byte 8 with 0x02", "the algorithm byte: 0x01 becomes 0x03, 0x02 becomes 0x00", "header",
                op="flip", byte=8, bit=1),
        variant("XOR byte 12 with 0x80", "the file id, now not the row's id", "header", op="flip", byte=12, bit=7),
        variant("XOR byte H − 1 with 0x01", "the last nonce-prefix byte", "last chunk", op="flip", byte=h - 1, bit=0),
        variant("XOR byte S − 1 with 0x01", "the last byte of the last tag", "last chunk", op="flip", byte=-1, bit=0),
        variant("keep the first S − 1 bytes", "the last byte cut", "length", op="truncate", drop=1),
        variant("keep the first S − 16 bytes", "the last 16 bytes cut", "length", op="truncate", drop=16),
        variant("append the byte 0x00", "a byte appended", "length", op="append", hex="00"),
        variant("keep the first H − 1 bytes", "cut inside the header", "header", op="truncate-to", length=h - 1),
    ]
    if name == "two-chunks":
        common += [
            variant("keep the first H + 65,552 bytes",
                    "cut at the chunk boundary: chunk 0, sealed with last = 0, is left as the last chunk", "length",
                    op="truncate-to", length=h + SEALED_CHUNK),
            variant("XOR byte H + 100 with 0x08", "a bit inside chunk 0's ciphertext", "chunk 0",
                    op="flip", byte=h + 100, bit=3),
            variant("keep the first H + 65,552 bytes and append bytes H to H + 65,551 again",
                    "the first chunk repeated as the last: the file becomes header || chunk_0 || chunk_0, "
                    "its 33-byte last chunk replaced by a second copy of the 65,552-byte chunk 0", "length",
                    op="duplicate-chunk", chunk=0),
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
                "plaintext": PLAINTEXT_RULES[name],
                **({"plaintext_hex": plaintext.hex()} if len(plaintext) <= SHOWN else {}),
                "plaintext_sha256": hashlib.sha256(plaintext).hexdigest(),
                "header": sealer.header.pack().hex(),
                "sealed_length": len(sealed),
                "sealed_sha256": hashlib.sha256(sealed).hexdigest(),
                "sealed_b64": base64.b64encode(sealed).decode(),
                # A reader's first check of its chunk code: chunk 0 whole (ciphertext and tag), sealed with last = 0.
                **({"chunk_0_hex": _chunk_0(sealed).hex(), "chunk_0_sha256": hashlib.sha256(_chunk_0(sealed)).hexdigest()}
                   if len(plaintext) > CHUNK_SIZE else {}),
                "must_fail": _variants(name, algorithm),
            })
    return {
        "inputs": INPUTS,
        "key_file": {"name": INPUTS["key_id"] + keys.KEY_SUFFIX, "text": keys.encode(master_key).decode("ascii")},
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


def _chunk_0(sealed: bytes) -> bytes:
    header = header_size(sealed[8])
    return sealed[header:header + SEALED_CHUNK]


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
    inputs, derived, key_file = fixture["inputs"], fixture["derived"], fixture["key_file"]
    lines = ["Inputs (hex unless quoted):", "", "```"]
    for key in ("master_key", "key_id", "file_id", "data_key", "wrap_nonce", "meta_nonce", "name", "type"):
        value = inputs[key]
        lines.append(f"{key:<14} {value if key not in ('key_id', 'name', 'type') else json.dumps(value, ensure_ascii=False)}")
    for algorithm, prefix in inputs["nonce_prefix"].items():
        lines.append(f"{'nonce_prefix':<14} {prefix}  ({algorithm})")
    lines += ["```", "",
              f"The master key's file, `tests/vectors/keys/{key_file['name']}`, holds these "
              f"{len(key_file['text'])} bytes (the last is LF):", "", "```", key_file["text"].rstrip("\n"), "```", "",
              "Derived:", "", "```"]
    for key in ("payload_key", "metadata_key"):
        lines.append(f"{key:<13} {derived[key]}")
    lines.append("wrapped_key")
    lines.append(_wrap(derived["wrapped_key"]))
    lines.append("meta")
    lines.append(_wrap(derived["meta"]))
    lines += ["```", "",
              f"The row of every vector: `id` = `\"{inputs['file_id']}\"`, `key_id` = `\"{inputs['key_id']}\"`, "
              "`wrapped_key` and `meta` the bytes above, `size` the plaintext length, `algorithm` the vector's "
              "algorithm name.", ""]
    for vector in fixture["vectors"]:
        sealed = base64.b64decode(vector["sealed_b64"])
        lines.append(f"**{vector['name']}**: {vector['plaintext_length']} plaintext bytes ({vector['plaintext']}), "
                     f"{vector['sealed_length']} sealed bytes, SHA-256 of the sealed file `{vector['sealed_sha256']}`")
        lines += ["", "```"]
        if "plaintext_hex" in vector and vector["plaintext_hex"]:
            lines.append("plaintext " + vector["plaintext_hex"])
        lines.append("header " + vector["header"])
        if len(sealed) <= SHOWN:
            lines.append("sealed")
            lines.append(_wrap(sealed.hex()))
        else:
            header = len(bytes.fromhex(vector["header"]))
            lines.append(f"chunk 0 tag   {sealed[header + SEALED_CHUNK - 16: header + SEALED_CHUNK].hex()}")
            lines.append(f"chunk 0 first {sealed[header: header + 32].hex()}")
            lines.append(f"chunk 0 sha256 {vector['chunk_0_sha256']}  (all 65,552 bytes: chunk_0_hex in the JSON)")
            lines.append(f"last chunk    {sealed[header + SEALED_CHUNK:].hex()}")
        lines += ["```", ""]
    lines += ["Each vector lists *must-fail* variants, operations on its sealed bytes with the row left as "
              "stated (`H` is the header length, `S` the sealed length). A reader MUST reject every one. "
              "`detected_by` names the reading step (see \"Reading\") that rejects it; the last three are "
              "in the two-chunk vectors only:", ""]
    longest = max(fixture["vectors"], key=lambda v: len(v["must_fail"]))
    for variant in longest["must_fail"]:
        lines.append(f"- {variant['does']}: {variant['why']}. Step *{variant['detected_by']}*.")
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
    KEY_FOLDER.mkdir(exist_ok=True)
    (KEY_FOLDER / fixture["key_file"]["name"]).write_text(fixture["key_file"]["text"], encoding="ascii")
    print(f"wrote {FIXTURE.relative_to(ROOT)}, {KEY_FOLDER.relative_to(ROOT)} and the vectors block of "
          f"{SPEC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
