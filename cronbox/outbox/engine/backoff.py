"""How long to wait before the next attempt.

Either exponential (base, doubling, capped, with +-20% jitter so a burst of
failures does not retry in lock-step) or an explicit list of delays, one per
attempt, the last repeated.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

from cronbox.outbox.core.errors import RegistrationError

DEFAULT_CAP = 900.0  # 15 minutes
JITTER = 0.2


class Backoff:
    def __init__(self, *, base: float | None = None, delays: Sequence[float] | None = None, cap: float = DEFAULT_CAP):
        if (base is None) == (delays is None):
            raise RegistrationError("backoff needs either a base or a list of delays")
        if base is not None and base < 0:
            raise RegistrationError(f"backoff base must be >= 0, not {base!r}")
        if delays is not None:
            delays = [float(d) for d in delays]
            if not delays or any(d < 0 for d in delays):
                raise RegistrationError("backoff delays must be a non-empty list of numbers >= 0")
        self.base = base
        self.delays = delays
        self.cap = cap

    @classmethod
    def of(cls, spec) -> "Backoff":
        """Accept what a decorator takes: a number (exponential base) or a list of delays."""
        if isinstance(spec, Backoff):
            return spec
        if isinstance(spec, bool):
            raise RegistrationError("backoff must be a number of seconds or a list of delays")
        if isinstance(spec, (int, float)):
            return cls(base=float(spec))
        if isinstance(spec, Sequence) and not isinstance(spec, str):
            try:
                return cls(delays=list(spec))
            except (TypeError, ValueError):
                raise RegistrationError("backoff delays must be numbers") from None
        raise RegistrationError("backoff must be a number of seconds or a list of delays")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        attempt = max(attempt, 1)
        if self.delays is not None:
            return self.delays[min(attempt, len(self.delays)) - 1]
        raw = min(self.cap, self.base * (2 ** min(attempt - 1, 32)))
        jittered = raw * (rng or random).uniform(1 - JITTER, 1 + JITTER)
        return min(self.cap, jittered)
