"""The queues a broker consumer uses beside its own, and the parked messages' read model.

For a queue Q (`python -m cronbox amqp consume --queue Q`):

- `Q.retry.<ms>ms`: one durable queue per retry delay, with `x-message-ttl` = that delay and
  `x-dead-letter-exchange` "" + `x-dead-letter-routing-key` Q. A failed message is republished there
  (publisher confirm, attempt header raised) before the original is acked; when its TTL runs out the
  broker dead-letters it back to Q. One TTL per queue, so messages expire in the order they came
  (RabbitMQ only expires messages at the head of a queue: mixed per-message TTLs would wait behind
  each other). Delays are the consumer's backoff without jitter, so a consumer makes a small,
  fixed set of these queues (exponential: about log2(cap / base) of them). No plugin needed.
- `Q.dead`: durable; messages parked with reason headers (`x-cronbox-reason`, `-attempts`,
  `-parked-at`, `-failed`). `amqp dead` lists them (got unacked, then given back: nothing is
  lost), `amqp retry-dead` moves chosen ones back to Q with the attempts reset.

The attempt count travels with the message (`x-cronbox-attempts`: failed attempts so far), as the
broker's own redelivery (after a crash or a lost connection) counts nothing. So does the count of
those redeliveries (`x-cronbox-redeliveries`): a delivery the broker flags `redelivered` is
republished to the back of Q with it raised, and parked once it reaches the limit (a poison
message that kills the consumer every time: consume.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from cronbox.outbox.core.text import clean_text
from cronbox.outbox.engine.backoff import Backoff
from cronbox.outbox.events.forward import KEY_HEADER, TYPE_HEADER

ATTEMPTS = "x-cronbox-attempts"
REASON = "x-cronbox-reason"
PARKED_AT = "x-cronbox-parked-at"
FAILED = "x-cronbox-failed"  # the consumers that failed, comma-separated
REDELIVERIES = "x-cronbox-redeliveries"  # times the message came back unacked (a killed consumer)
CRONBOX_HEADERS = (ATTEMPTS, REASON, PARKED_AT, FAILED, REDELIVERIES)
MAX_REDELIVERIES = 5
MAX_COUNT = 10_000  # no count header above this is trusted, whatever the consumers' limits
MAX_QUEUE = 200  # AMQP names are at most 255 bytes; room for ".retry.<ms>ms"
REASON_MAX = 1000


def dead_queue(queue: str) -> str:
    return f"{queue}.dead"


def retry_queue(queue: str, seconds: float) -> str:
    return f"{queue}.retry.{ttl_ms(seconds)}ms"


def ttl_ms(seconds: float) -> int:
    return max(0, int(round(seconds * 1000)))


class _Midpoint:
    """An rng for Backoff.delay that always draws the middle: no jitter, so each attempt's delay is
    one fixed value and one retry queue."""

    @staticmethod
    def uniform(low: float, high: float) -> float:
        return (low + high) / 2


def retry_delay(backoff: Backoff, attempt: int) -> float:
    """Seconds a message waits after its failed attempt number `attempt` (1-based)."""
    return backoff.delay(attempt, rng=_Midpoint())


def retry_later_delay(backoff: Backoff, max_attempts: int, seconds: float) -> float:
    """Where a RetryLater(seconds) waits: the smallest of the consumer's backoff delays at or above
    `seconds`, or its longest (then RetryLater is raised again, and waits again, using no attempt).
    Never a queue of its own per number of seconds: the set of retry queues stays the backoff's."""
    ladder = sorted({retry_delay(backoff, n) for n in range(1, min(max_attempts, 40) + 1)})
    return next((d for d in ladder if d >= seconds), ladder[-1])


def retry_arguments(queue: str, seconds: float) -> dict:
    return {"x-message-ttl": ttl_ms(seconds), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue}


def stamped(headers: dict | None, **values) -> dict:
    """The message's headers with cronbox's own replaced by `values` (None: removed)."""
    out = {k: v for k, v in (headers or {}).items() if k not in CRONBOX_HEADERS}
    out.update({k: v for k, v in values.items() if v is not None})
    return out


def attempts_of(headers: dict | None, name: str = ATTEMPTS, *, below: int = MAX_COUNT) -> int:
    """A count cronbox keeps in a message's header (ATTEMPTS, REDELIVERIES), as far as it can be
    trusted: anyone who can publish to Q can set these headers. Only an integer in [0, below) is one a
    cronbox consumer could have written (it parks a message before its count reaches the limit that
    `below` is), so anything else, a float, a string, bytes, a table, a negative number or 10**12,
    counts as 0: a forged header never parks a message early or makes ctx.attempt huge."""
    value = (headers or {}).get(name)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < below:
        return value
    return 0


def now_text() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Parked:
    """A message in Q.dead, as `amqp dead` shows it."""
    message_id: str | None
    type: str | None
    key: str | None
    reason: str
    attempts: int
    parked_at: str | None


def describe_parked(message) -> Parked:
    props = message.properties or {}
    headers = props.get("application_headers") or {}
    return Parked(_text(props.get("message_id")), _text(props.get("type") or headers.get(TYPE_HEADER)),
                  _text(headers.get(KEY_HEADER)), _text(headers.get(REASON)) or "?", attempts_of(headers),
                  _text(headers.get(PARKED_AT)))


def _text(value) -> str | None:
    """A header or property as the operator sees it: whatever its type, one clean line (a publisher
    wrote it: clean_text escapes line breaks, controls and bidi marks)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    text = str(value)
    return clean_text(text, len(text) * 6 + 1)
