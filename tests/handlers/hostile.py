"""Handlers that misbehave in every way a handler can (CRONBOX_HANDLERS=tests.handlers.hostile).

`CASES` maps a case name to (behaviour, expected outcome): "done", "retry" (an attempt used,
waiting again), "dead" (delivery dead / job failed). The consumer "hostile" and the job
"hostile.job" run the case named in the payload; "hostile.good" and "hostile.good_job" then
write a row each, to show that the rest of the run went on. Importing this module registers
them globally (for cronbox processes); `register(registry)` puts them in a test's registry.
"""
from __future__ import annotations

import sys

from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from sqlalchemy.orm import registry

from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.core.errors import PermanentFailure, RetryLater
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.pauses import ChannelPaused

metadata = MetaData()
rows = Table("hostile_rows", metadata, Column("id", Integer, primary_key=True), Column("tag", String(64)))


class Row:
    def __init__(self, **values):
        self.__dict__.update(values)


registry().map_imperatively(Row, rows)

PHONE = "+98 912 123 4567"
EMAIL = "jane.doe@example.com"


class Unprintable:
    def __str__(self):
        raise ValueError("no str")

    def __repr__(self):
        raise ValueError("no repr")


class BrokenStr(Exception):
    def __str__(self):
        raise RuntimeError("broken __str__")


class Boom(BaseException):
    """A BaseException of the handler's own."""


class ForeverLater(RetryLater):
    seconds = float("inf")

    def __init__(self):
        Exception.__init__(self, "forever")


class BadSeconds(RetryLater):
    def __init__(self):
        Exception.__init__(self, "bad seconds")

    @property
    def seconds(self):
        raise RuntimeError("no seconds")


def _raise(exc):
    def run(ctx):
        raise exc
    return run


def _print(stream_name: str):
    def run(ctx):
        print("h\xe9llo \udcff \u2603", file=getattr(sys, stream_name), flush=True)
    return run


async def _coroutine(ctx):
    raise AssertionError("never runs")


def _generator(ctx):
    yield 1


def _channel_paused(ctx):
    raise ChannelPaused("c" * 200, 60, "credit gone \udcff")


CASES = {
    "surrogate": (_raise(RuntimeError("oops \udcff")), "retry"),
    "newline-class-name": (_raise(type("Bad\nError\x1b", (Exception,), {})("x")), "retry"),
    "surrogate-permanent": (_raise(PermanentFailure("bad \udcff input")), "dead"),
    "str-raises": (_raise(BrokenStr("hidden")), "retry"),
    "unprintable-arg": (_raise(RuntimeError(Unprintable())), "retry"),
    "odd-args": (_raise(KeyError(b"\xff", None, {1: Unprintable})), "retry"),
    "no-args": (_raise(RuntimeError()), "retry"),
    "enormous": (_raise(RuntimeError("x" * 3_000_000)), "retry"),
    "newlines": (_raise(RuntimeError("one\ntwo\r\n2026-01-01T00:00:00.000Z ERROR forged\u2028three\x00\x1b[31m")),
                 "retry"),
    "phone-and-email": (_raise(RuntimeError(f"could not text {PHONE} or mail {EMAIL}")), "retry"),
    "system-exit": (_raise(SystemExit(3)), "retry"),
    "keyboard-interrupt": (_raise(KeyboardInterrupt()), "retry"),
    "generator-exit": (_raise(GeneratorExit()), "retry"),
    "own-base-exception": (_raise(Boom("mine")), "retry"),
    "retry-later-forever": (_raise(ForeverLater()), "retry"),
    "retry-later-bad-seconds": (_raise(BadSeconds()), "retry"),
    "async-def": (_coroutine, "retry"),
    "generator": (_generator, "retry"),
    "returns-int": (lambda ctx: 42, "done"),
    "returns-dict": (lambda ctx: {"ok": True}, "done"),
    "print-stdout": (_print("stdout"), "done"),
    "print-stderr": (_print("stderr"), "done"),
    "channel-paused-unstorable": (_channel_paused, "retry"),
}
# print() to a stream that cannot encode it: "done" in a cron process (cron.cli escapes what the
# stream cannot encode); under pytest's capture the stream may refuse it, which is a failed attempt.
PRINT_CASES = {"print-stdout", "print-stderr"}


def run_case(name: str, ctx):
    return CASES[name][0](ctx)


def consume(event, ctx):
    return run_case(event.payload["case"], ctx)


def work(payload, ctx):
    return run_case(payload["case"], ctx)


def good_consumer(event, ctx):
    ctx.session.execute(insert(rows).values(id=1_000_000 + event.id, tag="good-event"))


def good_job(payload, ctx):
    ctx.session.execute(insert(rows).values(id=2_000_000 + payload["n"], tag="good-job"))


def register(registry: Registry | None = None) -> None:
    consumer("hostile", name="hostile", max_attempts=5, backoff=[600], timeout=5, registry=registry)(consume)
    consumer("good", name="hostile.good", timeout=5, registry=registry)(good_consumer)
    # The hostile queue comes first (strict priority): the good job runs after every hostile one.
    job("hostile", name="hostile.job", tries=5, backoff=[600], timeout=5, registry=registry)(work)
    job("good", name="hostile.good_job", timeout=5, registry=registry)(good_job)


register()  # the default registry, for cronbox processes; in-process tests register in their own
