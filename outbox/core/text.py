"""The one list of characters that must never reach an operator's screen or a log line as they are.

C0 and C1 controls and DEL cut a line short or move a terminal's cursor; the bidi marks,
embeddings, overrides and isolates make `invoice\u202Efdp.exe` read as `invoiceexe.pdf` (and an
error text read as something else); U+2028/U+2029 break lines. Handler errors escape them
(outbox.engine.handler_call.clean_text), names and subjects shown to operators replace them
(storage.display), downloads' Content-Disposition drops them (cronbox.disposition).
"""
from __future__ import annotations

UNSHOWABLE = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"  # a regex character class body
