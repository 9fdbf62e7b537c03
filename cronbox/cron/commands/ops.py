"""`ops set-password`, `ops setup-token`, `ops logout-all`, `ops unlock`: the console's credentials
without a browser, e.g. from a cron line.

The password and token are files, so they are written even when the database
is down; ending sessions and recording the action then follow on a best-effort
basis, with a clear line when they could not. Imported lazily (cron.commands.base.CommandGroup):
Werkzeug's password hashing is not something a tick needs.
"""
from __future__ import annotations

import sys

import click
from sqlalchemy.exc import DBAPIError

from cronbox.cron.commands.base import CommandFailed, CommandGroup, runtime
from cronbox.cron.operator import actions, credentials, sessions, throttle
from cronbox.outbox.core.errors import CronboxError
from cronbox.outbox.core.transactions import in_transaction

ops = CommandGroup("ops", help="The operator console's password and sessions.")


def _read_password() -> str:
    if sys.stdin.isatty():
        return click.prompt("New operator password", hide_input=True, confirmation_prompt=True)
    return sys.stdin.readline().rstrip("\r\n")  # piped: one line


def _record(action: str, work=None, *, detail: str | None = None):
    """Do `work` (database) and record the action as operator "cli"; None when the database failed."""
    def run(s):
        result = work(s) if work else None
        return result, actions.record(s, action, operator="cli", detail=detail)

    rt = runtime(migrate=False)  # outside the try: a settings mistake is the operator's to fix, not an outage
    try:
        result, row = in_transaction(rt.sessions, run)
    except (DBAPIError, CronboxError) as exc:
        click.echo(f"ops: warning: {action} not recorded and sessions not ended ({type(exc).__name__}); "
                   "run `ops logout-all` when the database is back", err=True)
        return None
    actions.log(row)
    return result


@ops.command("set-password")
@click.option("--print-hash", is_flag=True,
              help="Print a hash for CRONBOX_OPS_PASSWORD_HASH in .env instead of writing the password file.")
def set_password(print_hash):
    """Set the operator password (prompted, or one line on stdin); ends every console session."""
    password = _read_password()
    try:
        credentials.validate_new_password(password, password)
    except credentials.CredentialError as exc:
        raise CommandFailed(str(exc), 2) from exc
    if print_hash:
        click.echo(credentials.make_hash(password))
        return
    settings = runtime(migrate=False).settings
    try:
        credentials.store_password(settings, password, replace=True)
    except credentials.CredentialError as exc:
        raise CommandFailed(str(exc)) from exc
    ended = _record("set-password", sessions.end_all)
    click.echo(f"ops: password set in {credentials.hash_file(settings)}"
               + (f"; {ended} console sessions ended" if ended is not None else ""))


@ops.command("setup-token")
@click.option("--reset", is_flag=True, help="Also remove the password file, so the setup page can set a new one.")
def setup_token(reset):
    """Write a one-time setup token to <instance>/ops-setup-token (read it in File Manager, never in a log)."""
    settings = runtime(migrate=False).settings
    try:
        path = credentials.new_setup_token(settings, reset=reset)
    except credentials.CredentialError as exc:
        raise CommandFailed(str(exc)) from exc
    ended = _record("setup-token", sessions.end_all if reset else None, detail="password removed" if reset else None)
    click.echo(f"ops: setup token written to {path}; open /ops/setup"
               + (f" ({ended} sessions ended)" if reset and ended is not None else ""))


@ops.command("logout-all")
def logout_all():
    """End every console session (e.g. after a lost laptop)."""
    ended = _record("logout-everywhere", sessions.end_all)
    if ended is None:
        raise CommandFailed("the database could not be reached: no session was ended")
    click.echo(f"ops: {ended} console sessions ended")


@ops.command()
def unlock():
    """Clear the login throttle (after a flood of wrong passwords locked the operator out too)."""
    cleared = _record("unlock", throttle.unlock)
    if cleared is None:
        raise CommandFailed("the database could not be reached: the throttle is unchanged")
    click.echo(f"ops: login throttle cleared ({cleared} counters)")
