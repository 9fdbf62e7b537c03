"""The command tree of `python -m cron` (also `flask --app app cron`, artisan_via_cron.sh).

Every command is registered here, explicitly: nothing registers itself by being imported. The
storage, ops and amqp groups are lazy (imported only when used): the storage commands pull in
libsodium and `cryptography`, megabytes a tick never needs; amqp, the broker client.
"""
from __future__ import annotations

import sys

import click

from cron.commands import demo, health, install_script, migrate, once, outbox, queue, schedule, tick
from cron.commands.base import Group, State, run
from outbox.engine.runtime import Runtime


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]},
             lazy={"storage": "cron.commands.storage:storage", "ops": "cron.commands.ops:ops",
                   "amqp": "cron.commands.amqp:amqp"})
@click.pass_context
def cli(ctx):
    """cronbox: outbox, job queue and sealed files run from cron."""
    state = ctx.ensure_object(State)
    ctx.call_on_close(state.close)


for command in (demo.demo, health.health, install_script.install_script, migrate.migrate, once.once,
                outbox.outbox, queue.queue, schedule.schedule, tick.tick):
    cli.add_command(command)


def main(argv: list[str] | None = None, *, runtime: Runtime | None = None) -> int:
    """Entry point of `python -m cron`: one line for any error, meaningful exit code.
    `runtime`: run inside an existing process (one-off runs from the tick) instead of opening one."""
    _never_fail_on_encoding()
    return run(cli, argv, runtime=runtime)


def _never_fail_on_encoding() -> None:
    """Under cron the locale is often C (ASCII) or PYTHONIOENCODING=ascii: text our output or a handler's
    print() cannot encode is escaped (\\xe9, \\udcff) instead of raising UnicodeEncodeError mid-run."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a TextIOWrapper (tests), or closed
            pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
