"""Fault injection for the crash-safety tests.

`CRONBOX_CRASH_AT=<step>[:<n>]` makes the process exit abruptly (os._exit: no
`finally`, no flush, like the SIGKILL a host's memory limit sends) the n-th
time (default: first) it reaches <step>. Steps: after-claim, before-ack-commit,
after-ack-commit. Unset in production; reading one environment variable is
the whole cost.
"""
from __future__ import annotations

import os

CRASH_EXIT_CODE = 86
_hits: dict[str, int] = {}


def crash_point(step: str) -> None:
    target = os.environ.get("CRONBOX_CRASH_AT")
    if not target:
        return
    name, _, nth = target.partition(":")
    if name != step:
        return
    _hits[step] = _hits.get(step, 0) + 1
    if _hits[step] >= int(nth or 1):
        os._exit(CRASH_EXIT_CODE)
