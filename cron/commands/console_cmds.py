"""`ops set-password`, `ops setup-token`, `ops logout-all`: the console's credentials without a browser.

Imported lazily (cron.cli.Group): it pulls in Werkzeug's password hashing,
which a tick never needs.
"""
from __future__ import annotations

import sys

import click

from cron.cli import CommandFailed, Group, runtime
from outbox.db import in_transaction
from web.ops import credentials, sessions

ops = Group("ops", help="The operator console's password and sessions.")


def _read_password() -> str:
    if sys.stdin.isatty():
        return click.prompt("New operator password", hide_input=True, confirmation_prompt=True)
    first = sys.stdin.readline().rstrip("\r\n")  # piped: one line (twice is not needed when nobody types)
    return first


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
    settings = runtime().settings
    try:
        credentials.store_password(settings, password, replace=True)
    except credentials.CredentialError as exc:
        raise CommandFailed(str(exc)) from exc
    ended = in_transaction(runtime().sessions, sessions.end_all)
    click.echo(f"ops: password set in {credentials.hash_file(settings)}; {ended} console sessions ended")


@ops.command("setup-token")
@click.option("--reset", is_flag=True, help="Also remove the password file, so the setup page can set a new one.")
def setup_token(reset):
    """Write a one-time setup token to the instance folder (read it in File Manager, never in a log)."""
    settings = runtime().settings
    try:
        path = credentials.new_setup_token(settings, reset=reset)
    except credentials.CredentialError as exc:
        raise CommandFailed(str(exc)) from exc
    ended = in_transaction(runtime().sessions, sessions.end_all) if reset else 0
    click.echo(f"ops: setup token written to {path}; open /ops/setup" + (f" ({ended} sessions ended)" if reset else ""))


@ops.command("logout-all")
def logout_all():
    """End every console session (e.g. after a lost laptop)."""
    click.echo(f"ops: {in_transaction(runtime().sessions, sessions.end_all)} console sessions ended")
