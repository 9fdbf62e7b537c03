"""The command tree of `python -m cronbox` (also `flask --app app cron`, artisan_via_cron.sh).

Every command is registered here, explicitly: nothing registers itself by being imported. Each is
named by the module that defines it and imported only when used (`CommandGroup`'s lazy commands): a
per-minute tick loads the tick's own code, not every other command's (the outbox, queue and health
views, retention, the channels' drivers, ~20 ms of a quiet tick's CPU), and the storage commands
pull in libsodium and `cryptography`, megabytes a tick never needs; amqp, the broker client.
`--help` lists them all (and imports them all, to show their help).
"""
from __future__ import annotations

import os
import sys
import threading
from functools import partial

import click

from cronbox.cron.commands.base import CommandGroup, State, run
from cronbox.outbox.engine.handler_process import end_command_process
from cronbox.outbox.engine.runtime import Runtime

# Every command of the root: its name, and the click command or group of its module in cron/commands/.
COMMANDS = {
    "amqp": "cronbox.cron.commands.amqp:amqp",
    "demo": "cronbox.cron.commands.demo:demo",
    "health": "cronbox.cron.commands.health:health",
    "install-script": "cronbox.cron.commands.install_script:install_script",
    "migrate": "cronbox.cron.commands.migrate:migrate",
    "once": "cronbox.cron.commands.once:once",
    "ops": "cronbox.cron.commands.ops:ops",
    "outbox": "cronbox.cron.commands.outbox:outbox",
    "queue": "cronbox.cron.commands.queue:queue",
    "schedule": "cronbox.cron.commands.schedule:schedule",
    "storage": "cronbox.cron.commands.storage:storage",
    "tick": "cronbox.cron.commands.tick:tick",
}


@click.group(cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"]}, lazy=COMMANDS)
@click.pass_context
def cli(ctx):
    """cronbox: outbox, job queue and sealed files run from cron."""
    state = ctx.ensure_object(State)
    if ctx.parent is not None:  # `flask --app app cron ...`: the host's flask process is this command's
        ctx.call_on_close(partial(_end_flask_command, set(threading.enumerate())))  # runs after state.close
    ctx.call_on_close(state.close)


def _end_flask_command(before: set[threading.Thread]) -> None:
    """Under `flask --app app cron`, the same end as `python -m cronbox`'s (script()): non-daemon threads a
    handler left must not keep the process alive past the run. Called as the command's context closes,
    where the command's click.Exit (or nothing, after a plain return) is the exception being handled."""
    raised = sys.exc_info()[1]
    if raised is None:
        end_command_process(0, before)
    elif isinstance(raised, click.exceptions.Exit):
        end_command_process(raised.exit_code, before)
    # any other error: flask reports it as usual


def main(argv: list[str] | None = None, *, runtime: Runtime | None = None) -> int:
    """Entry point of `python -m cronbox`: one line for any error, meaningful exit code.
    `runtime`: run inside an existing process (one-off runs from the tick) instead of opening one."""
    _never_fail_on_encoding()
    return run(cli, argv, runtime=runtime)


def script() -> int:
    """The `cronbox` script and `python -m cronbox`: main(), then the process ends with its exit code even
    if a handler left non-daemon threads running (outbox.engine.handler_process.end_command_process)."""
    _acknowledge_the_run()
    return end_command_process(main())


def _acknowledge_the_run() -> None:
    """artisan_via_cron.sh names a file in CRONBOX_RUN_ACK: writing it tells the script that what it
    started is cronbox's command line, not a module of the host's (or another package) by that name."""
    path = os.environ.pop("CRONBOX_RUN_ACK", "")
    if path:
        try:
            with open(path, "w", encoding="utf-8") as ack:
                ack.write(f"{os.getpid()} {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}\n")
        except OSError:
            pass  # the script then says this run was not cronbox's: the log folder is not writable either


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
