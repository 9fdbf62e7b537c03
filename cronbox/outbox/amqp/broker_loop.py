"""The run of a process fed by a broker queue: `amqp consume` (outbox.events.consume) and `amqp work`
(outbox.queue.broker_worker) share it.

One loop: stop when the budget says so (SIGTERM/SIGINT through StopSignals: the message in hand is
finished first, the loop only stops between messages), beat the run's heartbeat row every
heartbeat.BEAT_SECONDS (for `health`), open the connection (consumer_link.Link) and open it again with
backoff (1 s doubling to 30 s) after a loss until the run's end, hand what the broker sent to the
caller (`run_inbound`), send the batched acks once nothing more is read ahead, and wait for the broker
(AMQP heartbeats serviced) when idle. The caller says what a message means, what to do with its
database connection while idle (`release`), and what to give back when the run stops (`on_stop`).
"""
from __future__ import annotations

import logging
import time
from typing import Callable


from cronbox.outbox.core import clock
from cronbox.outbox.core.db_errors import CONNECTION_ERRORS, is_connection_lost
from cronbox.outbox.core.text import describe
from cronbox.outbox.engine import heartbeat
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.run_loop import RunResult, StopSignals
from cronbox.outbox.amqp.consumer_link import BROKER_ERRORS, Link, SetupError

log = logging.getLogger("cronbox")

POLL = 1.0
POLL_READY = 0.05  # reading what is already there: one delivery's frames may still be arriving
RECONNECT_FIRST, RECONNECT_MAX = 1.0, 30.0
DB_PAUSE = 3.0


class DatabaseLost(Exception):
    """The database connection went away mid-message: the message was given back to the queue."""


class BrokerLoop:
    def __init__(self, runtime, link: Link, *, command: str, detail: str, counts: Callable[[], dict],
                 run_inbound: Callable[[Budget], None], connected: Callable[[], str],
                 sessions: Callable[[], object] | None = None, release: Callable[[], None] = lambda: None,
                 on_stop: Callable[[], None] = lambda: None, stop_when_empty: bool = False,
                 stop_names: dict[str, str] | None = None, return_read_ahead: bool = False):
        self.runtime, self.link = runtime, link
        self.command, self.detail, self.counts = command, detail, counts  # the heartbeat row: `amqp consume`, its queue
        self.run_inbound, self.connected = run_inbound, connected
        self.sessions = sessions or (lambda: runtime.sessions)  # where the beats are written
        self.release, self.on_stop = release, on_stop
        self.stop_when_empty = stop_when_empty  # end "empty" once nothing came for POLL seconds
        self.stop_names = stop_names or {}
        self.return_read_ahead = return_read_ahead  # at a clean stop: Link.return_read_ahead
        self.connects = 0
        self._heartbeat_id: int | None = None
        self._last_beat = 0.0

    def run(self, budget: Budget) -> RunResult:
        with StopSignals(budget):
            self._heartbeat_id = heartbeat.start(self.runtime.sessions, self.command, detail=self.detail, beats=True)
            self._last_beat = clock.monotonic()
            try:
                result = self._loop(budget)
            except BaseException as exc:
                self.link.close(graceful=False)
                self.release()
                try:
                    heartbeat.finish(self.runtime.sessions, self._heartbeat_id, outcome="error", error=describe(exc),
                                     **self.counts())
                except Exception:
                    pass  # the database may be what failed: the row stays "running", as for a killed run
                raise
            self.give_back_read_ahead()
            self.link.close()
            self.release()
            heartbeat.finish(self.runtime.sessions, self._heartbeat_id, outcome=result.stop_reason, error=result.error,
                             **self.counts())
            return result

    def _loop(self, budget: Budget) -> RunResult:
        pause = RECONNECT_FIRST
        last_message = clock.monotonic()
        while True:
            reason = budget.stop_reason()
            if reason:
                self.on_stop()
                return RunResult(self.stop_names.get(reason, reason))
            self.beat()
            if not self.link.is_open:
                try:
                    self.link.open()
                except SetupError:
                    raise
                except BROKER_ERRORS as exc:
                    why = f"broker unreachable ({self.link.address!r}): {describe(exc, 300)}"
                    log.warning("%s: %s; trying again in %.0fs", self.command, why, pause)
                    if not self.pause(budget, pause):
                        return RunResult("broker-unreachable", 1, why)
                    pause = min(pause * 2, RECONNECT_MAX)
                    continue
                pause = RECONNECT_FIRST
                self.connects += 1
                log.info("%s: connected to %r, %s", self.command, self.link.address, self.connected())
            try:
                if self.link.inbound:
                    self.run_inbound(budget)
                    last_message = clock.monotonic()
                    continue
                if self.link.acks_pending:
                    if self.link.readable():  # more read ahead: its ack can go with theirs
                        self.link.poll(POLL_READY)
                        continue
                    self.link.flush_acks()
                self.link.poll(min(POLL, max(budget.remaining(), 0.05)))
                if not self.link.inbound and clock.monotonic() - last_message >= POLL:
                    self.release()  # idle: hold no database connection while waiting
                    if self.stop_when_empty:
                        return RunResult("empty")
            except DatabaseLost as exc:
                log.warning("%s: database connection lost (%s); pausing %.0fs", self.command, exc, DB_PAUSE)
                self.release()
                if not self.pause(budget, DB_PAUSE):
                    return RunResult("lost-connection", 1, "database unreachable until the end of the run")
            except BROKER_ERRORS as exc:
                log.warning("%s: broker connection lost (%s); reconnecting", self.command, describe(exc, 300))
                self.link.close(graceful=False)

    def give_back_read_ahead(self) -> None:
        """The run stops cleanly: what the broker sent ahead and nothing started goes back without the
        `redelivered` flag (Link.return_read_ahead), for a caller that takes that flag for a consumer's
        death (`amqp consume`, not in ordered mode: there a republish would break the order). A broker
        failing meanwhile leaves the close as before: the rest come back flagged."""
        if not self.return_read_ahead or not self.link.is_open:
            return
        try:
            given = self.link.return_read_ahead()
        except Exception as exc:
            log.warning("%s: could not give back the messages read ahead (%s); they come back flagged redelivered",
                        self.command, describe(exc, 300))
            if isinstance(exc, BROKER_ERRORS):
                self.link.close(graceful=False)  # the broker may not answer a close handshake
            return
        if given:
            log.info("%s: %d message(s) read ahead and not started given back to the queue", self.command, given)

    def beat(self) -> None:
        """The run's heartbeat row, every BEAT_SECONDS (a database gone only skips a beat)."""
        if clock.monotonic() - self._last_beat < heartbeat.BEAT_SECONDS:
            return
        self._last_beat = clock.monotonic()
        try:
            heartbeat.beat(self.sessions(), self._heartbeat_id, **self.counts())
        except CONNECTION_ERRORS as exc:
            if not is_connection_lost(exc):
                raise
            self.release()
            log.warning("%s: could not beat (database unreachable)", self.command)

    def pause(self, budget: Budget, seconds: float) -> bool:
        """Wait up to `seconds` (a signal or the run's end cuts it short); False if the run is over."""
        end = clock.monotonic() + min(seconds, budget.remaining())
        while clock.monotonic() < end:
            if budget.signalled:
                return False
            self.beat()
            time.sleep(min(0.1, max(end - clock.monotonic(), 0)))
        return budget.remaining() > 0.05 and not budget.signalled
