"""artisan_via_cron.sh as cron runs it: real processes under `env -i PATH=/usr/bin:/bin HOME=...`.

Each test builds an app folder `$HOME/apps/my app` (a space on purpose) holding a copy of the script
and symlinks to the worktree's packages, so a `.env` written there never touches the real app root.
The script exports CRONBOX_APP_ROOT=<that folder>, so Python reads a `.env` written there too, but the
environment the test passes (DATABASE_URL, CRONBOX_INSTANCE) wins over it; the script's own `.env`
reading is checked through the Python it picks and the log folder it writes to. Stand-in interpreters are small sh wrappers that record that
they ran (and the exact argv) and exec the real virtualenv's Python.
"""
from __future__ import annotations

import os
import pty
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cronbox import outbox
import cronbox
from tests.conftest import APP_ROOT
from tests.handlers.effects import metadata as effects_metadata
from tests.helpers import wait_for

SCRIPT = APP_ROOT / "artisan_via_cron.sh"
BARE_PATH = "/usr/bin:/bin"
# The script exports CRONBOX_APP_ROOT (this app folder), where Python then finds the handler modules too.
LINKED = ("cronbox", "app.py", "tests")  # the package, the standalone app and the test handlers, linked in
# What the script needs from PATH besides a Python (the no-Python test runs with only these).
TOOLS = ("readlink", "sed", "tail", "date", "mkdir", "find", "rm", "sort", "tr", "grep", "head")
sqlite_only = pytest.mark.backends("sqlite")


@dataclass
class App:
    home: Path
    root: Path
    elsewhere: Path  # a working directory that is neither $HOME nor the app

    @property
    def script(self) -> Path:
        return self.root / "artisan_via_cron.sh"

    def python(self, path: Path | str, label: str, *, works: bool = True, real: bool = True) -> Path:
        """A stand-in interpreter at `path` (relative to the app) that records each run, then execs the
        real Python (or, with real=False, stops there: enough where only the choice is tested)."""
        path = self.root / path
        path.parent.mkdir(parents=True, exist_ok=True)
        ran, argv = shlex.quote(str(self.home / "ran.txt")), shlex.quote(str(self.home / "argv.bin"))
        body = "#!/bin/sh\n"
        if works:
            body += (f'printf "%s\\n" "{label} $*" >>{ran}\n'
                     f'[ "$1" = -m ] && printf "%s\\0" "$@" >{argv}\n'
                     + (f'exec {shlex.quote(sys.executable)} "$@"\n' if real
                        else '[ -n "${CRONBOX_RUN_ACK:-}" ] && : >"$CRONBOX_RUN_ACK"\nexit 0\n'))  # "I am cronbox"
        else:
            body += "exit 1\n"  # there, executable, but it does not run (a venv whose Python was removed)
        path.write_text(body)
        path.chmod(0o755)
        return path

    def ran(self) -> list[str]:
        """Labels of the interpreters that ran a cronbox command (not just the `import sys` probe)."""
        record = self.home / "ran.txt"
        lines = record.read_text().splitlines() if record.exists() else []
        return [line.split(" ", 1)[0] for line in lines if " -m cronbox" in line]

    def argv(self) -> list[str]:
        return (self.home / "argv.bin").read_bytes().decode().split("\0")[:-1]

    def dotenv(self, text: str, newline: str = "\n") -> None:
        (self.root / ".env").write_bytes(text.replace("\n", newline).encode())

    def log(self, instance: Path | None = None) -> str:
        logs = (instance or self.root / "instance") / "logs"
        return "".join(p.read_text() for p in sorted(logs.glob("cron-*.log")))


@pytest.fixture
def app(tmp_path) -> App:
    home = tmp_path / "home"
    root = home / "apps" / "my app"
    root.mkdir(parents=True)
    shutil.copy2(SCRIPT, root / SCRIPT.name)
    for name in LINKED:
        (root / name).symlink_to(APP_ROOT / name)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return App(home=home, root=root, elsewhere=elsewhere)


def bare(app: App, env: dict[str, str] | None, path: str) -> list[str]:
    """`env -i` with cron's environment: PATH, HOME and whatever the test adds, nothing else."""
    return ["/usr/bin/env", "-i", f"PATH={path}", f"HOME={app.home}", *(f"{k}={v}" for k, v in (env or {}).items())]


def run(app: App, *args: str, env: dict[str, str] | None = None, command: Path | str | None = None,
        cwd: Path | None = None, path: str = BARE_PATH) -> subprocess.CompletedProcess:
    """Run the script (or a link to it) with ARGS through /bin/sh -c, from another directory."""
    argv = [*bare(app, env, path), "/bin/sh", "-c", '"$0" "$@"', str(command or app.script), *args]
    return subprocess.run(argv, cwd=str(cwd or app.elsewhere), capture_output=True, text=True, timeout=120)


def cron_line(app: App, line: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """What cron does with a crontab line: /bin/sh -c LINE in $HOME."""
    return subprocess.run([*bare(app, env, BARE_PATH), "/bin/sh", "-c", line], cwd=str(app.home),
                          capture_output=True, text=True, timeout=120)


def silent_success(proc: subprocess.CompletedProcess) -> None:
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", ""), proc


def one_line_failure(proc: subprocess.CompletedProcess, code: int) -> str:
    assert proc.returncode == code, proc
    assert proc.stdout == "", proc
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and proc.stderr.endswith("\n"), proc.stderr
    assert lines[0].startswith("artisan_via_cron.sh: ") and "Traceback" not in lines[0]
    return lines[0]


def start_line(log: str) -> str:
    [line] = [line for line in log.splitlines() if " start: " in line]
    return line


def pid_of(line: str) -> str:
    return line.split("[", 1)[1].split("]", 1)[0]


def todays_logs() -> set[str]:
    """Today's log file name (UTC), and the next one's if the day ends within the next minute."""
    return {time.strftime("cron-%Y-%m-%d.log", time.gmtime(time.time() + ahead)) for ahead in (0, 60)}


# --- static checks ---------------------------------------------------------------------------------

def test_the_script_is_posix_sh_and_executable():
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text().startswith("#!/bin/sh\n")
    dash = shutil.which("dash")
    if dash is None:
        pytest.skip("dash is not installed (apt-get install dash)")
    subprocess.run([dash, "-n", str(SCRIPT)], check=True)


@pytest.mark.parametrize("tool, args", [("shellcheck", ["-s", "sh"]), ("checkbashisms", ["-p", "-x"])])
def test_the_script_passes_the_linters(tool, args):
    if shutil.which(tool) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed (.ci/run installs it)")
        pytest.skip(f"{tool} is not installed")
    proc = subprocess.run([tool, *args, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- where it runs from --------------------------------------------------------------------------

@sqlite_only
def test_a_cron_line_in_a_bare_environment_is_silent_and_logged(app, env, runtime):
    app.python(".venv/bin/python", "venv")
    instance = Path(env["CRONBOX_INSTANCE"])
    proc = cron_line(app, f"{shlex.quote(str(app.script))} tick --no-linger", env)
    silent_success(proc)
    log = app.log(instance)
    line = start_line(log)
    assert line.endswith(f"] start: tick --no-linger (python: {app.root}/.venv/bin/python)")
    lines = log.splitlines()
    assert len(lines) == 3 and lines[1].startswith("tick: delivered 0,")
    assert f"[{pid_of(line)}] exit 0: tick --no-linger (" in lines[2]
    logs = instance / "logs"
    assert logs.stat().st_mode & 0o777 == 0o700
    [file] = logs.glob("cron-*.log")
    assert file.name in todays_logs()
    assert file.stat().st_mode & 0o777 == 0o600
    assert app.ran() == ["venv"]


@pytest.mark.parametrize("how", ["absolute symlink", "relative symlink chain", "symlinked folder",
                                 "sh NAME from its folder", "sh PATH, no execute bit"])
def test_it_finds_its_app_folder_however_it_is_called(app, how):
    """The log lands in <app>/instance whatever the working directory and however the path winds."""
    app.python(".venv/bin/python", "venv")
    cwd, command, env = app.elsewhere, None, None
    if how == "absolute symlink":
        command = app.home / "bin" / "cronbox"
        command.parent.mkdir()
        command.symlink_to(app.script)
    elif how == "relative symlink chain":
        # From $HOME: ../elsewhere/second -> first -> ../links/inner -> ../home/apps/my app/artisan_via_cron.sh
        # (each target relative to its link's folder, none to the working directory).
        links = app.elsewhere.parent / "links"
        links.mkdir()
        (links / "inner").symlink_to(Path("..") / "home" / "apps" / "my app" / "artisan_via_cron.sh")
        (app.elsewhere / "first").symlink_to(Path("..") / "links" / "inner")
        (app.elsewhere / "second").symlink_to("first")
        cwd, command = app.home, "../elsewhere/second"
    elif how == "symlinked folder":
        (app.elsewhere / "site").symlink_to(app.root)
        decoy = app.home / "decoy"  # a CDPATH (set in some logins) must not send `cd site` there
        (decoy / "site").mkdir(parents=True)
        env, command = {"CDPATH": str(decoy)}, "site/artisan_via_cron.sh"
    else:  # the script read by sh: from its folder, or (an upload lost its x bit) by absolute path
        if how == "sh PATH, no execute bit":
            app.script.chmod(0o644)
            command, cwd = str(app.script), app.home
        else:
            command, cwd = "artisan_via_cron.sh", app.root
        proc = subprocess.run([*bare(app, None, BARE_PATH), "/bin/sh", command, "outbox", "--help"],
                              cwd=str(cwd), capture_output=True, text=True, timeout=60)
        silent_success(proc)
        assert "Usage: python -m cronbox outbox" in app.log()
        return
    proc = run(app, "outbox", "--help", command=command, cwd=cwd, env=env)
    silent_success(proc)
    log = app.log()
    assert "Usage: python -m cronbox outbox" in log and " exit 0: outbox --help (" in log
    assert not (app.elsewhere / "instance").exists() and not (app.home / "instance").exists()


def test_it_runs_under_dash(app):
    dash = shutil.which("dash")
    if dash is None:
        pytest.skip("dash is not installed")
    app.python("venv/bin/python", "venv")
    proc = subprocess.run([*bare(app, None, BARE_PATH), dash, str(app.script), "--help"], cwd=str(app.elsewhere),
                          capture_output=True, text=True, timeout=60)
    silent_success(proc)
    assert app.ran() == ["venv"]


# --- which Python --------------------------------------------------------------------------------

@pytest.mark.parametrize("home_is_a_symlink", [False, True])
def test_the_newest_selector_virtualenv_wins(app, tmp_path, home_is_a_symlink):
    """cPanel's Python Selector: ~/virtualenv/<app folder relative to home>/<version>/bin/python."""
    selector = Path("..") / ".." / "virtualenv" / "apps" / "my app"  # relative to the app folder
    for version in ("3.9", "3.10", "3.11", "3.8"):
        app.python(selector / version / "bin" / "python", version)
    app.python(selector / "3.12-old" / "bin" / "python", "3.12-old")  # not a version name: ignored
    (app.root / selector / "notes.txt").write_text("not a version either")
    home = app.home
    if home_is_a_symlink:  # /home -> /home2 on many cPanel servers: HOME is the link
        home = tmp_path / "home-link"
        home.symlink_to(app.home)
    proc = run(app, "--help", env={"HOME": str(home)})
    silent_success(proc)
    assert app.ran() == ["3.11"]
    assert start_line(app.log()).endswith("/virtualenv/apps/my app/3.11/bin/python)")


def test_a_broken_newest_selector_version_falls_back_to_the_next(app):
    base = Path("..") / ".." / "virtualenv" / "apps" / "my app"
    app.python(base / "3.9" / "bin" / "python", "3.9")
    app.python(base / "3.12" / "bin" / "python", "3.12", works=False)
    silent_success(run(app, "--help"))
    assert app.ran() == ["3.9"]


@pytest.mark.parametrize("layout, winner", [
    ({"venv/bin/python": True, ".venv/bin/python": True, "selector": True}, "venv"),
    ({"venv/bin/python": False, ".venv/bin/python": True, "selector": True}, ".venv"),
    ({".venv/bin/python": False, "selector": True}, "selector"),
    ({"venv/bin/python": False}, "python3"),
])
def test_the_search_order(app, tmp_path, layout, winner):
    for where, works in layout.items():
        if where == "selector":
            app.python(Path("..") / ".." / "virtualenv" / "apps" / "my app" / "3.11" / "bin" / "python", "selector", real=False)
        else:
            app.python(where, where.split("/")[0], works=works, real=False)
    bin_dir = tmp_path / "bin"  # a python3 on PATH we can tell from the system's
    app.python(bin_dir / "python3", "python3", real=False)
    proc = run(app, "--help", path=f"{bin_dir}:{BARE_PATH}")
    silent_success(proc)
    assert app.ran() == [winner]


def test_cronbox_python_in_the_environment_comes_first(app, tmp_path):
    app.python("venv/bin/python", "venv")
    chosen = app.python(tmp_path / "py" / "python", "chosen")
    app.dotenv(f"CRONBOX_PYTHON={app.root / 'venv/bin/python'}\n")
    # Surrounding blanks go, as outbox/core/settings.py strips every value.
    silent_success(run(app, "--help", env={"CRONBOX_PYTHON": f"  {chosen} "}))
    assert app.ran() == ["chosen"]


@pytest.mark.parametrize("line", [
    "CRONBOX_PYTHON={py}",
    'CRONBOX_PYTHON="{py}"',
    "CRONBOX_PYTHON='{py}'",
    "  export   CRONBOX_PYTHON = \"{py}\"   # the Selector's interpreter",
    "CRONBOX_PYTHON={py}   # comment",
    "CRONBOX_PYTHON=/nonexistent/python\nCRONBOX_PYTHON={py}",  # the last one wins, as in python-dotenv
    "CRONBOX_PYTHON=~/py dir/python",
    "CRONBOX_PYTHON=${{HOME}}/py dir/python",
])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_cronbox_python_only_in_dotenv(app, line, newline):
    """.env beats ./venv; quotes, spaces, `export`, comments and CRLF (File Manager) are handled."""
    chosen = app.python(app.home / "py dir" / "python", "dotenv", real=False)
    app.python(".venv/bin/python", "venv", real=False)
    app.dotenv("# settings\nDATABASE_URL=sqlite:///x.db\nCRONBOX_PYTHON_OLD=/nonexistent\n"
               + line.format(py=chosen) + "\nOTHER=1\n", newline)
    silent_success(run(app, "--help"))
    assert app.ran() == ["dotenv"]


@pytest.mark.parametrize("source", ["environment", ".env"])
def test_an_unusable_cronbox_python_is_an_error_not_a_silent_fallback(app, source):
    app.python(".venv/bin/python", "venv")
    missing = str(app.home / "virtualenv" / "gone" / "bin" / "python")
    env = {"CRONBOX_PYTHON": missing} if source == "environment" else None
    if source == ".env":
        app.dotenv(f"CRONBOX_PYTHON='{missing}'\n")
    line = one_line_failure(run(app, "tick", env=env), 1)
    where = "the environment" if source == "environment" else f"{app.root}/.env"
    assert f"CRONBOX_PYTHON={missing} (from {where}) is not a Python that runs (log: {app.root}/instance/logs/" \
        in line
    assert app.ran() == []
    assert "is not a Python that runs" in app.log()


def test_no_usable_python_is_one_clear_line(app, tmp_path):
    bin_dir = tmp_path / "bin"  # the tools the script needs, and a python3 that does not run
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    app.python(bin_dir / "python3", "python3", works=False)
    app.python("venv/bin/python", "venv", works=False)
    (app.root / ".venv" / "bin").mkdir(parents=True)
    (app.root / ".venv" / "bin" / "python").write_text("#!/bin/sh\n")  # not executable
    proc = run(app, "tick", path=str(bin_dir))
    line = one_line_failure(proc, 1)
    assert "no usable Python (tried ./venv/bin/python, ./.venv/bin/python, " in line
    assert f"{app.home}/virtualenv/apps/my app/<version>/bin/python, python3 on PATH ({bin_dir})" in line
    assert f"set CRONBOX_PYTHON in {app.root}/.env" in line
    assert any(line.endswith(f"(log: {app.root}/instance/logs/{name})") for name in todays_logs())
    assert "no usable Python" in app.log()


# --- .env is read, never run ---------------------------------------------------------------------

def test_dotenv_is_never_sourced(app, tmp_path):
    pwned = [tmp_path / f"pwned-{n}" for n in range(5)]
    app.python(".venv/bin/python", "venv")
    app.dotenv(f"CRONBOX_X=$(touch {pwned[0]})\n"
               f"CRONBOX_Y=`touch {pwned[1]}`\n"
               f"touch {pwned[2]}\n"
               f"CRONBOX_INSTANCE=instance; touch {pwned[3]}\n"
               "CRONBOX_CRON_TOKEN=s3cret-token-value\n")
    silent_success(run(app, "--help"))
    assert app.ran() == ["venv"]
    # The literal value, odd as it is, names the folder: it was read as text.
    assert " exit 0: --help (" in app.log(app.root / f"instance; touch {pwned[3]}")
    app.dotenv(f"CRONBOX_PYTHON=$(touch {pwned[4]})\nCRONBOX_CRON_TOKEN=s3cret-token-value\n")
    line = one_line_failure(run(app, "tick"), 1)
    assert f"CRONBOX_PYTHON=$(touch {pwned[4]}) (from {app.root}/.env) is not a Python that runs" in line
    assert not any(p.exists() for p in pwned)
    assert "s3cret" not in line + app.log() + app.log(app.root / f"instance; touch {pwned[3]}")


@pytest.mark.parametrize("value, where", [
    ("var/cronbox", "{root}/var/cronbox"),
    ('"~/private/cronbox"', "{home}/private/cronbox"),
    ("${{HOME}}/private/cronbox  # outside public_html", "{home}/private/cronbox"),
])
def test_the_instance_folder_from_dotenv(app, value, where):
    app.python(".venv/bin/python", "venv")
    app.dotenv(f"CRONBOX_INSTANCE={value.format()}\n")
    silent_success(run(app, "--help"))
    instance = Path(where.format(root=app.root, home=app.home))
    assert " exit 0: --help (" in app.log(instance)
    assert not (app.root / "instance").exists()


def test_the_environment_wins_over_dotenv_for_the_instance(app, tmp_path):
    app.python(".venv/bin/python", "venv")
    app.dotenv("CRONBOX_INSTANCE=from-dotenv\n")
    silent_success(run(app, "--help", env={"CRONBOX_INSTANCE": str(tmp_path / "from-env")}))
    assert " exit 0: --help (" in app.log(tmp_path / "from-env")
    assert not (app.root / "from-dotenv").exists()


@pytest.mark.parametrize("dotenv, env, where", [
    ("CRONBOX_APP = 'clinic:create_app'  # the host app\n", {}, "instance/cronbox"),
    ("CRONBOX_APP=clinic:create_app\nCRONBOX_INSTANCE=var/cb\n", {}, "var/cb"),
    ("", {"CRONBOX_APP": "clinic:create_app"}, "instance/cronbox"),
    ("CRONBOX_APP=clinic:create_app\n", {"CRONBOX_APP": " "}, "instance"),  # set in the environment, blank: unset
    ("CRONBOX_APP=$(touch {pwned})\n", {}, "instance/cronbox"),  # text, never run
])
def test_a_host_app_keeps_the_log_in_the_extensions_instance(app, tmp_path, dotenv, env, where):
    """With CRONBOX_APP the instance folder is the Cronbox extension's, <app.instance_path>/cronbox
    (Flask's instance_path is <app folder>/instance): the cron log goes next to cronbox's own log."""
    pwned = tmp_path / "pwned"
    app.python(".venv/bin/python", "venv")
    app.dotenv(dotenv.format(pwned=pwned))
    silent_success(run(app, "--help", env=env))
    assert " exit 0: --help (" in app.log(app.root / where)
    others = {"instance", "instance/cronbox", "var/cb"} - {where}
    assert not any((app.root / other / "logs").exists() for other in others)
    assert not pwned.exists()


def test_python_gets_the_app_folder_as_cronbox_app_root(app):
    seen = app.home / "app-root.txt"
    python = app.root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nprintf "%s" "$CRONBOX_APP_ROOT" >{shlex.quote(str(seen))}\n'
                      '[ -n "${CRONBOX_RUN_ACK:-}" ] && : >"$CRONBOX_RUN_ACK"\nexit 0\n')
    python.chmod(0o755)
    silent_success(run(app, "tick", env={"CRONBOX_APP_ROOT": "/somewhere/else"}))
    assert seen.read_text() == str(app.root)  # the folder whose .env the script read, symlinks resolved


# --- what runs is cronbox's, or a loud failure ---------------------------------------------------

SHADOWS = {  # what a host app may have at its root, each written to exit 0 if it were ever run
    "cron.py": "cron.py", "cron": "cron/__main__.py", "storage.py": "storage.py", "storage": "storage/__init__.py",
    "outbox.py": "outbox.py", "outbox": "outbox/__init__.py",
}


def shadow(folder: Path, name: str) -> None:
    path = folder / SHADOWS[name]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name == "__main__.py":
        (path.parent / "__init__.py").write_text("")
    path.write_text("import sys\nprint('the host\\'s own module ran')\nsys.exit(0)\n")


@sqlite_only
@pytest.mark.parametrize("where", ["root", "pythonpath"])
def test_the_hosts_cron_storage_and_outbox_modules_never_take_cronboxs_place(app, env, runtime, tmp_path, where):
    """Before 0.7 the script ran `python -m cron`, and a host's cron.py at its root ran instead, exit 0:
    nothing relayed, no mail. Now it runs `-m cronbox`, whatever the host has by those names, in its
    root or on PYTHONPATH."""
    app.python(".venv/bin/python", "venv")
    folder = app.root if where == "root" else tmp_path / "on-path"
    for name in ("cron.py", "storage.py", "outbox.py"):
        shadow(folder, name)
    other = tmp_path / "packages"
    for name in ("cron", "storage", "outbox"):
        shadow(other, name)
    extra = {"PYTHONPATH": f"{folder}:{other}"} if where == "pythonpath" else {"PYTHONPATH": str(other)}
    proc = run(app, "tick", "--no-linger", env={**env, **extra})
    silent_success(proc)
    log = app.log(Path(env["CRONBOX_INSTANCE"]))
    assert "tick: " in log and "the host's own module ran" not in log


@pytest.mark.parametrize("impostor", ["a cronbox.py at the app root", "a Python without cronbox's command line"])
def test_a_command_that_is_not_cronboxs_fails_loudly_even_with_exit_0(app, impostor):
    if impostor.startswith("a cronbox.py"):
        app.python(".venv/bin/python", "venv")
        (app.root / "cronbox").unlink()  # the app root's link to the checkout's cronbox, replaced by the host's
        (app.root / "cronbox.py").write_text("print('not cronbox')\n")
    else:
        python = app.root / ".venv" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text("#!/bin/sh\nexit 0\n")  # an interpreter that runs something else and says nothing
        python.chmod(0o755)
    proc = run(app, "tick")
    line = one_line_failure(proc, 1)
    assert "tick: '" in line and "-m cronbox' exited 0 but is not cronbox's command line" in line
    assert " exit 0: tick (" in app.log()  # the log has the run as it happened, then the failure
    assert "is not cronbox's command line" in app.log()


# --- arguments, exit codes, the log --------------------------------------------------------------

ODD_ARGS = ["a b", "it's", 'say "hi"', "", "*", "$HOME", "`id`", "--all", "-"]


def test_arguments_pass_through_intact(app):
    app.python(".venv/bin/python", "venv")
    (app.root / "a file").write_text("a glob must not expand to me")
    proc = run(app, "outbox", "retry", *ODD_ARGS)
    line = one_line_failure(proc, 2)
    assert app.argv() == ["-m", "cronbox", "outbox", "retry", *ODD_ARGS]
    # The log shows the command as it would be typed again, quoting what needs it.
    typed = "outbox retry 'a b' 'it'\\''s' 'say \"hi\"' '' '*' '$HOME' '`id`' --all -"
    assert f"] start: {typed} (python: " in app.log()
    assert f" exit 2: {typed} (" in app.log()
    assert line.startswith(f"artisan_via_cron.sh: {typed} failed with exit 2: error: ")
    assert shlex.split(typed) == ["outbox", "retry", *ODD_ARGS]


def test_a_crontab_line_with_quotes(app):
    app.python(".venv/bin/python", "venv")
    line = f"""{shlex.quote(str(app.script))} outbox retry 'a b' "it's" '' '*' --all"""
    proc = cron_line(app, line)
    assert one_line_failure(proc, 2)
    assert app.argv() == ["-m", "cronbox", "outbox", "retry", "a b", "it's", "", "*", "--all"]


def test_a_usage_error_is_one_line_with_its_code_and_the_log(app):
    app.python(".venv/bin/python", "venv")
    proc = run(app, "nosuch")
    line = one_line_failure(proc, 2)
    assert line in {f"artisan_via_cron.sh: nosuch failed with exit 2: error: No such command 'nosuch'. "
                    f"(see `python -m cronbox --help`) (log: {app.root}/instance/logs/{name})" for name in todays_logs()}
    log = app.log()
    assert "error: No such command 'nosuch'." in log and " exit 2: nosuch (" in log
    # The script made the instance folder: private, as the health check wants it.
    assert {(p.stat().st_mode & 0o777) for p in (app.root / "instance", app.root / "instance" / "logs")} == {0o700}


def test_a_missing_command_is_one_line(app):
    """`python -m cronbox` alone prints its help, then one error line: the mail gets that line only."""
    app.python(".venv/bin/python", "venv")
    line = one_line_failure(run(app), 2)
    assert "(no command) failed with exit 2: error: no command given" in line


@sqlite_only
def test_a_failing_command_keeps_its_exit_code(app, env, runtime):
    app.python(".venv/bin/python", "venv")
    proc = run(app, "outbox", "retry", "424242", env=env)
    line = one_line_failure(proc, 1)
    assert "outbox retry 424242 failed with exit 1: error: unknown dead delivery id(s): 424242" in line
    assert " exit 1: outbox retry 424242 (" in app.log(Path(env["CRONBOX_INSTANCE"]))


def test_a_traceback_goes_to_the_log_and_its_last_line_to_the_mail(app, tmp_path):
    """A Python without cronbox's dependencies: the mail says why in one line."""
    app.python(".venv/bin/python", "venv")
    bare_python = tmp_path / "bare-python"  # the system Python: no click, no SQLAlchemy
    system = "/usr/bin/python3"
    if not os.access(system, os.X_OK) or subprocess.run([system, "-c", "import click"],
                                                        capture_output=True).returncode == 0:
        pytest.skip("needs a system python3 without click")
    bare_python.symlink_to(system)
    line = one_line_failure(run(app, "tick", env={"CRONBOX_PYTHON": str(bare_python)}), 1)
    assert line.startswith("artisan_via_cron.sh: tick failed with exit 1: ModuleNotFoundError: No module named")
    assert "Traceback (most recent call last):" in app.log()


def test_an_unwritable_log_is_one_line_and_nothing_runs(app, tmp_path):
    app.python(".venv/bin/python", "venv")
    not_a_folder = tmp_path / "instance-file"
    not_a_folder.write_text("")
    line = one_line_failure(run(app, "tick", env={"CRONBOX_INSTANCE": str(not_a_folder)}), 1)
    assert f"cannot write the log {not_a_folder}/logs/cron-" in line
    assert app.ran() == []


def test_old_cron_logs_are_pruned_when_a_new_day_starts(app):
    app.python(".venv/bin/python", "venv")
    logs = app.root / "instance" / "logs"
    logs.mkdir(parents=True)
    month_ago, week_ago = time.time() - 31 * 86400 - 3600, time.time() - 7 * 86400
    for name, when in [("cron-2000-01-01.log", month_ago), ("cron-2000-02-01.log", week_ago),
                       ("cronbox-2000-01-01.log", month_ago), ("notes.txt", month_ago)]:
        (logs / name).write_text("old\n")
        os.utime(logs / name, (when, when))
    silent_success(run(app, "--help"))
    left = {p.name for p in logs.iterdir()}
    assert {"cron-2000-02-01.log", "cronbox-2000-01-01.log", "notes.txt"} < left and "cron-2000-01-01.log" not in left
    assert len(left) == 4 and left & todays_logs()


def test_by_hand_in_a_terminal_the_output_is_shown(app):
    """cPanel Terminal: a person typing the command sees its output (cron never has a terminal)."""
    app.python(".venv/bin/python", "venv")
    master, slave = pty.openpty()
    proc = subprocess.Popen([*bare(app, None, BARE_PATH), str(app.script), "outbox", "--help"],
                            stdin=slave, stdout=slave, stderr=slave, cwd=str(app.elsewhere))
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the terminal's other end closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    assert b"Usage: python -m cronbox outbox" in shown
    log = app.log()
    assert "(output shown on the terminal)" in log and " exit 0: outbox --help (" in log


# --- overlapping ticks and signals ---------------------------------------------------------------

@pytest.fixture
def blocking_tick(app, env, runtime, tmp_path):
    """One event for the consumer that waits for a file: a tick holds the lock as long as we want."""
    effects_metadata.create_all(runtime.engine)
    with runtime.sessions.begin() as session:
        cronbox.record(session, "block", {"n": 0})
    app.python(".venv/bin/python", "venv")
    inside, release = tmp_path / "inside", tmp_path / "release"
    tick_env = {**env, "CRONBOX_HANDLERS": "tests.handlers.effects",
                "TEST_INSIDE_FILE": str(inside), "TEST_RELEASE_FILE": str(release)}
    return tick_env, inside, release


def start(app: App, env: dict[str, str], *args: str) -> subprocess.Popen:
    """The script as cron starts it, in a process group of its own (so a test can signal the group)."""
    return subprocess.Popen([*bare(app, env, BARE_PATH), str(app.script), *args], cwd=str(app.home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@sqlite_only
def test_overlapping_ticks_one_is_skipped_silently(app, blocking_tick):
    env, inside, release = blocking_tick
    first = start(app, env, "tick", "--no-linger")
    try:
        wait_for(inside.exists, "the first tick inside the blocking consumer")
        second = run(app, "tick", "--no-linger", env=env)
        silent_success(second)
        log = app.log(Path(env["CRONBOX_INSTANCE"]))
        assert "skipped: tick already running" in log
        [skipped] = [line for line in log.splitlines() if " start: " in line and f"[{first.pid}]" not in line]
        assert f"[{pid_of(skipped)}] exit 0: tick --no-linger (" in log
        assert first.poll() is None
        release.write_text("go")
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert (first.returncode, out, err) == (0, "", "")
    log = app.log(Path(env["CRONBOX_INSTANCE"]))
    assert "tick: delivered 1," in log
    assert log.count(" exit 0: tick --no-linger (") == 2


@sqlite_only
def test_a_sigterm_to_the_group_is_waited_out_and_logged(app, blocking_tick):
    """The host stops the run: Python finishes its handler and says so; the script logs the outcome."""
    env, inside, release = blocking_tick
    proc = start(app, env, "tick", "--max-time", "30")
    try:
        wait_for(inside.exists, "the tick inside the blocking consumer")
        os.killpg(proc.pid, signal.SIGTERM)
        # Python took the signal (its log says so) rather than a fixed moment after sending it, which
        # a loaded machine could pass before the signal was even handled.
        logs = Path(env["CRONBOX_INSTANCE"]) / "logs"
        wait_for(lambda: "received SIGTERM" in "".join(p.read_text() for p in logs.glob("cronbox-*.log")),
                 "Python to take the SIGTERM")
        assert proc.poll() is None  # neither the script nor Python died of it
        release.write_text("go")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (proc.returncode, out, err) == (0, "", "")
    log = app.log(Path(env["CRONBOX_INSTANCE"]))
    assert "tick: delivered 1," in log and "(stopped: signal)" in log
    assert " exit 0: tick --max-time 30 (" in log and ", got SIGTERM)" in log
