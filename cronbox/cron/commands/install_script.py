"""`install-script [DIR]`: put the packaged artisan_via_cron.sh into a host app's folder.

An installed cronbox has its cron script in site-packages, where no cPanel cron line should point
(it changes with every upgrade and finds no app there). The copy in DIR makes DIR the app root:
the script runs from its own folder, so `.env` and `instance/` are looked for beside it. This
command needs no database and no app root: it is how an app root comes to exist.
"""
from __future__ import annotations

import os
import shlex
import sys
import tempfile
from importlib import resources
from pathlib import Path

import click

from cronbox.cron.commands.base import CommandFailed

SCRIPT = "artisan_via_cron.sh"
MODE = 0o755


def packaged_script() -> bytes:
    """The script as this cronbox ships it (a symlink to the top-level one in a checkout)."""
    try:
        return resources.files("cronbox.cron").joinpath(SCRIPT).read_bytes()
    except OSError as exc:
        raise CommandFailed(f"this cronbox has no {SCRIPT} ({exc.strerror}); reinstall it") from exc


def cron_line(target: Path, python: str | None) -> str:
    """The per-minute line for cPanel's Cron Jobs page. CRONBOX_PYTHON names this Python unless the
    script finds its virtualenv by itself (DIR/venv or DIR/.venv, whichever of its interpreters runs
    this: `venv/bin/python3` is the same virtualenv as the script's `venv/bin/python`): cron's
    python3 on PATH has no cronbox."""
    line = f"* * * * * {shlex.quote(str(target))} tick"
    if python and Path(python).is_absolute() and not _in_a_virtualenv_the_script_finds(Path(python), target.parent):
        line = f"* * * * * CRONBOX_PYTHON={shlex.quote(python)} {shlex.quote(str(target))} tick"
    return line.replace("%", "\\%")  # cron turns a bare % into a newline


def _in_a_virtualenv_the_script_finds(python: Path, folder: Path) -> bool:
    return python.name.startswith("python") and python.parent in (folder / "venv" / "bin", folder / ".venv" / "bin")


@click.command("install-script")
@click.argument("folder", metavar="[DIR]", required=False, default=".",
                type=click.Path(exists=True, file_okay=False, dir_okay=True, path_type=Path))
@click.option("--force", is_flag=True, help=f"Replace an existing {SCRIPT} that differs from this cronbox's.")
def install_script(folder: Path, force: bool):
    """Copy artisan_via_cron.sh into DIR (default: here), the app's folder, mode 0755, and print its cron line."""
    content = packaged_script()
    target = folder.resolve() / SCRIPT
    if target.is_dir():
        raise CommandFailed(f"{target} is a folder, not the script; move it away first")
    if os.path.lexists(target) and not force:
        if _read(target) != content:
            raise CommandFailed(f"{target} exists and differs from this cronbox's script; "
                                "use --force to replace it")
        if not target.is_symlink() and target.stat().st_mode & 0o777 != MODE:
            _chmod(target)
        click.echo(f"install-script: {target} is already this cronbox's script")
    else:
        _write(target, content)
        click.echo(f"install-script: wrote {target}")
    click.echo("Add this line in cPanel > Cron Jobs (settings go in .env beside the script):")
    click.echo(cron_line(target, sys.executable))


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # a dangling symlink, or unreadable: not our script either way
        return None


def _write(target: Path, content: bytes) -> None:
    """Through a temporary file and a rename: cron never runs a half-written script, and a symlink
    at `target` is replaced, not the file it points to."""
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{SCRIPT}.", dir=target.parent)
        with os.fdopen(handle, "wb") as out:
            out.write(content)
        os.chmod(temporary, MODE)  # mkstemp's 0600, whatever the umask: cron and the owner run it
        os.replace(temporary, target)
        temporary = None
    except OSError as exc:
        raise CommandFailed(f"cannot write {target}: {exc.strerror}") from exc
    finally:
        if temporary is not None:
            try:
                os.unlink(temporary)
            except OSError:
                pass


def _chmod(target: Path) -> None:
    try:
        target.chmod(MODE)
    except OSError as exc:
        raise CommandFailed(f"cannot make {target} executable: {exc.strerror}") from exc
