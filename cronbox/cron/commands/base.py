"""What every command module shares: the error contract, the lazily built runtime, running a tree.

Exit codes: 0 ok (also "skipped: already running"), 1 failure, 2 usage error.
User mistakes and unreachable databases print one line, never a traceback;
unexpected errors print one line and leave the traceback in the log.

Command modules import this, never `cronbox.cron.cli`: the root group imports them (explicitly, in
`cron/cli.py`), and a command that runs other command lines (`tick`, `once run`) takes the tree
from its click context (`command_runner()`).
"""
from __future__ import annotations

import errno
import importlib
import logging
from functools import partial

import click
from sqlalchemy.exc import DBAPIError

from cronbox.cron.hostapp import current_host_app
from cronbox.outbox.core.db_errors import is_unreachable
from cronbox.outbox.core.errors import CronboxError
from cronbox.outbox.core.text import describe
from cronbox.outbox.engine.runtime import Runtime, open_runtime
from cronbox import storage as sealed_storage
from cronbox.storage import payload_keys

log = logging.getLogger("cronbox")
PROG = "python -m cronbox"


class CommandFailed(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None):
        click.echo(f"error: {self.format_message()}", err=True)


class CommandGroup(click.Group):
    """Turns cronbox and database errors into one-line CommandFailed, under any entry point.

    `lazy` names subcommands imported only when used (Click's lazy-group pattern): the storage
    commands pull in libsodium and `cryptography`, megabytes a tick never needs.
    """

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name in self.lazy and name not in self.commands:
            module, _, attribute = self.lazy[name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except CronboxError as exc:
            raise CommandFailed(str(exc), exc.exit_code) from exc
        except DBAPIError as exc:
            if is_unreachable(exc):
                raise CommandFailed(f"database unreachable: {describe(exc.orig)}") from exc
            log.exception("database error")
            raise CommandFailed(f"database error: {describe(exc.orig)}") from exc
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # a full disk or quota: the operator's to fix
                where = f" ({exc.filename})" if exc.filename else ""
                raise CommandFailed(f"disk full{where}: {exc.strerror}; free some space or raise the account's quota"
                                    ) from exc
            log.exception("internal error")
            raise CommandFailed(f"internal error: {describe(exc)} (traceback in the cronbox log)") from exc
        except Exception as exc:
            log.exception("internal error")
            raise CommandFailed(f"internal error: {describe(exc)} (traceback in the cronbox log)") from exc


class State:
    """ctx.obj: builds the runtime only for commands that need the database (not for --help).
    A runtime handed in (one-off runs inside the tick) is used as is and not closed."""

    def __init__(self, runtime: Runtime | None = None):
        self._runtime = runtime
        self._owned = runtime is None
        self._host = None

    def runtime(self, *, migrate: bool = True) -> Runtime:
        if self._runtime is None:
            self._host = current_host_app()  # CRONBOX_APP or `flask --app`: the host's settings and context
            if self._host is not None:
                self._runtime = self._host.open_runtime(migrate=migrate)
            else:
                self._runtime = open_runtime(role="cron", migrate=migrate)
                payload_keys.check_vault(self._runtime.settings, warn=False)  # CRONBOX_SEAL_PAYLOADS=all: usable?
                # storage.* in handlers: these settings, resolved now, whatever a handler does to os.environ
                sealed_storage.use(self._runtime.settings, self._runtime.sessions)
        return self._runtime

    def close(self):
        try:
            if self._runtime is not None and self._owned:
                self._runtime.dispose()
        finally:
            if self._host is not None:
                self._host.close()


def runtime(migrate: bool = True) -> Runtime:
    return click.get_current_context().find_object(State).runtime(migrate=migrate)


def run(root: click.Group, argv: list[str] | None = None, *, runtime: Runtime | None = None) -> int:
    """Run a command line on `root`: one line for any error, meaningful exit code.
    `runtime`: run inside an existing process (one-off runs from the tick) instead of opening one."""
    try:
        result = root.main(args=argv, prog_name=PROG, standalone_mode=False, obj=State(runtime))
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.NoArgsIsHelpError as exc:  # no command at all: show what there is, then say so
        click.echo(exc.ctx.get_help())
        click.echo(f"error: no command given (see `{exc.ctx.command_path} --help`)", err=True)
        return 2
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else PROG
        click.echo(f"error: {exc.format_message()} (see `{where} --help`)", err=True)
        return 2
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("error: aborted", err=True)
        return 1
    except (KeyboardInterrupt, EOFError):
        click.echo("error: interrupted", err=True)
        return 1
    return result if isinstance(result, int) else 0


def command_runner():
    """Runs command lines on cronbox's tree of the command now running (for one-off requests): the
    outermost group holding the State, which under `flask --app clinic cron` is the `cron` group,
    not Flask's root."""
    tree = context = click.get_current_context()
    while context is not None:
        if isinstance(context.obj, State):
            tree = context
        context = context.parent
    return partial(run, tree.command)
