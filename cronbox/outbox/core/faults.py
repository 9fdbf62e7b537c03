"""Fault injection for the crash-safety tests.

`CRONBOX_CRASH_AT=<step>[:<n>]` makes the process exit abruptly (os._exit: no
`finally`, no flush, like the SIGKILL a host's memory limit sends) the n-th
time (default: first) it reaches <step>. Steps: after-claim, before-ack-commit,
after-ack-commit, after-publish (forwarding, and the job publisher: the batch written to the broker,
its confirms not yet read), after-publish-confirm (the job publisher: confirms read, the leases not
yet written, outbox/queue/publisher.py); and for `amqp consume` (outbox/events/consume.py): before-inbox-commit (a consumer's
writes and inbox row about to commit), after-inbox-commit (every consumer committed, the broker
ack not sent), before-broker-ack / after-broker-ack (around one batched basic.ack multiple),
before-read-ahead-ack (a clean stop's message read ahead republished, its original not acked:
outbox/amqp/consumer_link.py Link.return_read_ahead); and
worker-start (a pool's child, before its first claim, outbox/queue/pool.py). Unset in production;
reading one environment variable is
the whole cost.
"""
from __future__ import annotations

import os

CRASH_EXIT_CODE = 86
_hits: dict[str, int] = {}
# Read once: a crash point sits on every item's path, and the variable is set before the process
# starts (the tests run a fresh process per fault).
_TARGET = os.environ.get("CRONBOX_CRASH_AT") or ""
_STEP, _, _NTH = _TARGET.partition(":")


def crash_point(step: str) -> None:
    if not _TARGET or step != _STEP:
        return
    _hits[step] = _hits.get(step, 0) + 1
    if _hits[step] >= int(_NTH or 1):
        os._exit(CRASH_EXIT_CODE)
