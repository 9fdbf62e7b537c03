"""cronbox installed as a package (`pip install <checkout>`, a wheel) into a virtualenv outside the
checkout, and run the way a host app on shared hosting runs it: from a bare cron environment, in a
folder that is not the checkout, with a host package of its own beside it.

The venv and the wheel are built once per source state (tests/package_helpers.py).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cronbox.outbox.core.migrate import SCHEMA_HEAD
from cronbox.outbox.core.settings import NO_APP_ROOT
from tests.package_helpers import (CHECKOUT, NOT_SOURCES, PACKAGES, Build, installed_build, installed_env,
                                   pip_env)

pytestmark = pytest.mark.timeout(900)  # the first test waits for the build

SCRIPT = "artisan_via_cron.sh"
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)")


@pytest.fixture(scope="module")
def build() -> Build:
    return installed_build()


def run(build: Build, *args: str, cwd: Path, home: Path, stdin: str = "", **extra: str):
    return subprocess.run([str(build.python), *args], cwd=str(cwd), env=installed_env(home, **extra),
                          capture_output=True, text=True, timeout=120, input=stdin)


def cron(build: Build, *args: str, cwd: Path, home: Path, **extra: str):
    return run(build, "-m", "cronbox", *args, cwd=cwd, home=home, **extra)


def one_line_error(proc) -> str:
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    return lines[0]


def written_by_cronbox(folder: Path) -> list[Path]:
    """What a cronbox run may have left: an instance folder, a database, its logs or locks."""
    return [p for p in folder.rglob("*") if p.name in ("instance", "logs", "locks", "keys", "private")
            or p.suffix in (".db", ".db-journal", ".db-wal", ".lock")]


@pytest.fixture
def folders(tmp_path):
    """An empty working folder and an empty $HOME, both outside the checkout."""
    cwd, home = tmp_path / "empty", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    return cwd, home


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = PIN.match(line.strip())
        if match:
            found[normalized(match.group(1))] = match.group(2)
    return found


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def package_files() -> dict[str, Path]:
    """Every file of the package folder in the checkout, by its path in a wheel: the same path (one real
    folder, the design card's outbox/, storage/ and cron/ inside it)."""
    return {path.relative_to(CHECKOUT).as_posix(): path for package in PACKAGES for path in (CHECKOUT / package).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


def test_wheel_holds_one_package_cronbox_with_its_data_and_the_real_cron_script(build):
    wheels = list(build.wheel.glob("cronbox-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        infos = {info.filename: info for info in wheel.infolist()}
        dist_info = {name.split("/")[0] for name in infos if name.split("/")[0].endswith(".dist-info")}
        assert len(dist_info) == 1
        (meta,) = dist_info
        assert {name.split("/")[0] for name in infos} == {"cronbox", meta}
        shipped = {name for name in infos if not name.startswith(meta)}
        assert "cronbox/py.typed" in shipped  # PEP 561: type checkers read the installed package's hints
        # Every source file, template, stylesheet and migration of the packages, and nothing else.
        assert shipped == set(package_files())
        for name, path in package_files().items():
            assert wheel.read(name) == path.read_bytes(), name
        script = infos[f"cronbox/cron/{SCRIPT}"]
        mode = script.external_attr >> 16
        assert not stat.S_ISLNK(mode) and mode & 0o777 == 0o755
        assert wheel.read(f"cronbox/cron/{SCRIPT}") == (CHECKOUT / SCRIPT).read_bytes()  # the content, not a link
        assert wheel.read(f"cronbox/cron/{SCRIPT}").startswith(b"#!/bin/sh\n")


def test_installed_distribution_is_one_package_cronbox_at_the_pinned_versions(build, folders):
    cwd, home = folders
    probe = r"""
import json, sysconfig
from importlib import metadata
dist = metadata.distribution("cronbox")
print(json.dumps({
    "record": [str(f) for f in dist.files],
    "versions": {d.metadata["Name"]: d.version for d in metadata.distributions()},
    "purelib": sysconfig.get_paths()["purelib"],
    "requires": dist.requires,
}))
"""
    proc = run(build, "-c", probe, cwd=cwd, home=home)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    in_site_packages = [f for f in found["record"] if not f.startswith("..")]  # ../../../bin/cronbox
    tops = {f.split("/")[0] for f in in_site_packages if ".dist-info/" not in f}
    assert tops == {"cronbox"}, tops  # no outbox, storage, cron, app, web, migrations, tests, examples...
    site = Path(found["purelib"])
    for name in ("outbox", "storage", "cron", "app.py", "passenger_wsgi.py", "web", "migrations", "tests", "bench",
                 "examples"):
        assert not (site / name).exists(), name
    installed = site / "cronbox" / "cron" / SCRIPT
    assert not installed.is_symlink() and installed.read_bytes() == (CHECKOUT / SCRIPT).read_bytes()
    assert installed.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in (site / "cronbox" / "cron" / "migrations" / "versions").glob("*.py"))[-1].startswith(
        SCHEMA_HEAD.split("_")[0])

    # requirements.txt was the constraint file of the install: each runtime pin is what got installed,
    # and each has a range in pyproject.toml (pip refused the install if a range excluded a pin).
    versions = {normalized(name): version for name, version in found["versions"].items()}
    pinned = pins(CHECKOUT / "requirements.txt")
    assert {name: versions.get(name) for name in pinned} == pinned
    declared = tomllib.loads((CHECKOUT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    ranged = {normalized(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]) for spec in declared}
    assert ranged == set(pinned)


# Commands that check their arguments before opening the database get valid ones here, so every
# command reaches the point where it needs an app root.
ARGUMENTS = {
    "amqp consume": ["--queue", "q"],
    "amqp dead": ["--queue", "q"],
    "amqp retry-dead": ["--queue", "q", "--all"],
    "amqp work": ["--queue", "q"],
    "once add": ["migrate"],
    "outbox retry": ["--all"],
    "outbox skip": ["--all"],
    "queue retry": ["--all"],
    "storage grant": ["1", "--subject", "x"],
    "storage put": ["{file}", "--owner", "x"],
}
STDIN = {"ops set-password": "a long enough operator password\n"}
NEEDS_NO_APP = {"install-script"}  # writes into the folder it is given; tested below


def leaf_commands(build: Build, cwd: Path, home: Path) -> dict[str, list[str]]:
    """Every command of the installed tree, with a value for each required argument."""
    walk = r"""
import json, click
from cronbox.cron.cli import cli
ctx = click.Context(cli)
found = {}
def walk(group, path):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            walk(command, path + [name])
        else:
            found[" ".join(path + [name])] = [p.human_readable_name for p in command.params
                                             if p.required and isinstance(p, click.Argument)]
walk(cli, [])
print(json.dumps(found))
"""
    proc = run(build, "-c", walk, cwd=cwd, home=home)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_type_checker_reads_the_installed_packages_hints(build, tmp_path):
    """mypy (the checkout's, pinned) on a user's file against the wheel installed in a fresh venv: the
    hints come from the installed package (py.typed), so a wrong call is an error, a right one clean."""
    user = tmp_path / "user_app.py"
    user.write_text("from cronbox import job, record\n\n"
                    "@job('sms', name='user.sms')\n"
                    "def send(payload: dict, ctx: object) -> None: ...\n\n"
                    "def dispatch(session: object) -> int | None:\n"
                    "    return send.dispatch(session, {'to': 1}, delay='soon')\n")
    mypy = [sys.executable, "-m", "mypy", "--no-incremental", "--python-executable", str(build.python),
            "--config-file", os.devnull, "--follow-imports", "silent", str(user)]
    checked = subprocess.run(mypy, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert 'Argument "delay" to "__call__" of "Dispatch" has incompatible type "str"' in checked.stdout, checked.stdout
    assert 'Argument 1 to "__call__" of "Dispatch" has incompatible type "object"' in checked.stdout, checked.stdout
    assert "site-packages" not in checked.stdout and "missing library stubs" not in checked.stdout, checked.stdout
    user.write_text(user.read_text().replace("session: object", "session: 'sqlalchemy.orm.Session'")
                    .replace("delay='soon'", "delay=5").replace("from cronbox", "import sqlalchemy.orm\nfrom cronbox"))
    checked = subprocess.run(mypy, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_without_an_app_root_every_command_refuses_in_one_line_and_writes_nothing(build, folders, tmp_path):
    cwd, home = folders
    upload = tmp_path / "upload.txt"
    upload.write_text("a file to seal")
    commands = leaf_commands(build, cwd, home)
    assert "tick" in commands and "migrate" in commands and "storage verify" in commands

    def attempt(name: str):
        args = [a.format(file=upload) for a in ARGUMENTS.get(name, ["1"] * len(commands[name]))]
        return name, run(build, "-m", "cronbox", *name.split(), *args, cwd=cwd, home=home, stdin=STDIN.get(name, ""))

    with ThreadPoolExecutor(max_workers=4) as pool:  # one process per command, a few at a time
        results = list(pool.map(attempt, sorted(set(commands) - NEEDS_NO_APP)))
    for name, proc in results:
        assert proc.returncode == 1, (name, proc.stdout, proc.stderr)
        assert one_line_error(proc) == f"error: {NO_APP_ROOT}", name
        assert proc.stdout == "", name
    assert list(cwd.iterdir()) == [] and list(home.iterdir()) == []
    assert written_by_cronbox(build.venv) == []


def test_help_works_anywhere(build, folders):
    cwd, home = folders
    for where in (cwd, Path("/")):
        proc = cron(build, "--help", cwd=where, home=home)
        assert proc.returncode == 0 and proc.stderr == ""
        assert "install-script" in proc.stdout and "tick" in proc.stdout
        proc = cron(build, "install-script", "--help", cwd=where, home=home)
        assert proc.returncode == 0 and "[DIR]" in proc.stdout
    assert list(cwd.iterdir()) == [] and written_by_cronbox(build.venv) == []


def test_install_script_makes_the_folder_an_app_root_that_migrates_and_ticks(build, folders, tmp_path):
    cwd, home = folders
    app = tmp_path / "my app"  # a space: the printed cron line must quote it
    app.mkdir()
    installed = cron(build, "install-script", cwd=app, home=home)  # DIR defaults to the current folder
    assert installed.returncode == 0, installed.stderr
    script = app / SCRIPT
    assert script.read_bytes() == (CHECKOUT / SCRIPT).read_bytes()
    assert script.stat().st_mode & 0o777 == 0o755 and not script.is_symlink()
    assert sorted(p.name for p in app.iterdir()) == [SCRIPT]  # no database, no instance folder: just the script
    line = installed.stdout.strip().splitlines()[-1]
    assert line == f"* * * * * CRONBOX_PYTHON={build.python} '{script}' tick"

    migrated = cron(build, "migrate", cwd=app, home=home)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip() == f"migrate: empty -> {SCHEMA_HEAD}"  # the migrations came from the package
    assert (app / "instance" / "cronbox.db").is_file()
    ticked = cron(build, "tick", "--no-linger", cwd=app, home=home)
    assert ticked.returncode == 0, ticked.stderr
    assert ticked.stdout.startswith("tick: delivered 0")

    # The printed line, as cron runs it: /bin/sh, $HOME as the working folder, a bare environment.
    command = line.removeprefix("* * * * * ") + " --no-linger"
    by_cron = subprocess.run(["/bin/sh", "-c", command], cwd=str(home), env=installed_env(home),
                             capture_output=True, text=True, timeout=120)
    assert by_cron.returncode == 0 and by_cron.stdout + by_cron.stderr == "", by_cron.stderr
    logs = list((app / "instance" / "logs").glob("cron-*.log"))
    assert logs and "exit 0: tick --no-linger" in logs[0].read_text()
    assert list(home.iterdir()) == [] and list(cwd.iterdir()) == []
    assert written_by_cronbox(build.venv) == []


def test_install_script_never_overwrites_another_script_without_force(build, folders, tmp_path):
    cwd, home = folders
    app = tmp_path / "app"
    app.mkdir()
    mine = app / SCRIPT
    mine.write_text("#!/bin/sh\necho the host's own script\n")
    refused = cron(build, "install-script", str(app), cwd=cwd, home=home)
    assert refused.returncode == 1
    assert "differs" in one_line_error(refused) and "--force" in refused.stderr
    assert mine.read_text() == "#!/bin/sh\necho the host's own script\n"

    forced = cron(build, "install-script", "--force", str(app), cwd=cwd, home=home)
    assert forced.returncode == 0 and mine.read_bytes() == (CHECKOUT / SCRIPT).read_bytes()
    mine.chmod(0o644)  # uploaded through File Manager: the same script, not executable
    again = cron(build, "install-script", str(app), cwd=cwd, home=home)
    assert again.returncode == 0 and "already" in again.stdout and mine.stat().st_mode & 0o777 == 0o755

    elsewhere = tmp_path / "elsewhere.sh"
    elsewhere.write_text("#!/bin/sh\n")
    mine.unlink()
    mine.symlink_to(elsewhere)  # a link to another file: replaced by --force, its target left alone
    assert cron(build, "install-script", str(app), cwd=cwd, home=home).returncode == 1
    assert cron(build, "install-script", "--force", str(app), cwd=cwd, home=home).returncode == 0
    assert not mine.is_symlink() and elsewhere.read_text() == "#!/bin/sh\n"

    (tmp_path / "folder" / SCRIPT).mkdir(parents=True)
    assert cron(build, "install-script", str(tmp_path / "folder"), cwd=cwd, home=home).returncode == 1
    missing = cron(build, "install-script", str(tmp_path / "nowhere"), cwd=cwd, home=home)
    assert missing.returncode == 2 and "does not exist" in one_line_error(missing)
    assert list(cwd.iterdir()) == []


HOST_WEB = '''"""The host's own package `web`, with cronbox set up in its factory."""
from flask import Flask

from cronbox import Cronbox


def create_app():
    app = Flask(__name__)
    app.config["CRONBOX_HANDLERS"] = "web.events"
    Cronbox().init_app(app)
    return app
'''

HOST_EVENTS = '''from cronbox import consumer


@consumer("greeted", name="web.log_greeting")
def log_greeting(event, ctx):
    from pathlib import Path
    Path(__file__).resolve().parents[1].joinpath("greeted.txt").write_text(event.payload["who"])
'''


def test_a_host_package_named_web_runs_beside_the_installed_cronbox(build, folders, tmp_path):
    cwd, home = folders
    host = tmp_path / "clinic"
    (host / "web").mkdir(parents=True)
    (host / "web" / "__init__.py").write_text(HOST_WEB)
    (host / "web" / "events.py").write_text(HOST_EVENTS)
    probe = (
        "import importlib.util, sys; print(importlib.util.find_spec('web') is None)"
    )
    assert run(build, "-c", probe, cwd=cwd, home=home).stdout.strip() == "True"  # cronbox brings no `web`

    imported = run(build, "-c", "import web, cronbox; app = web.create_app(); "
                   "print(web.__file__); print(app.extensions['cronbox'].settings.database_url)",
                   cwd=host, home=home)
    assert imported.returncode == 0, imported.stderr
    web_file, database = imported.stdout.strip().splitlines()
    assert Path(web_file) == host / "web" / "__init__.py"
    assert database == f"sqlite:///{host / 'instance' / 'cronbox' / 'cronbox.db'}"

    # Its cron commands: CRONBOX_APP names the host's factory, from cron's $HOME.
    assert cron(build, "migrate", cwd=host, home=home, CRONBOX_APP="web:create_app").returncode == 0
    record = ("import web; from cronbox import record; app = web.create_app(); rt = app.extensions['cronbox'].runtime\n"
              "with rt.sessions.begin() as s: record(s, 'greeted', {'who': 'Ada'})")
    recorded = run(build, "-c", record, cwd=host, home=home)
    assert recorded.returncode == 0, recorded.stderr
    ticked = cron(build, "tick", "--no-linger", cwd=home, home=home, CRONBOX_APP="web:create_app",
                  CRONBOX_APP_ROOT=str(host))
    assert ticked.returncode == 0, ticked.stderr
    assert ticked.stdout.startswith("tick: delivered 1")
    assert (host / "greeted.txt").read_text() == "Ada"
    assert written_by_cronbox(build.venv) == [] and list(cwd.iterdir()) == []


def copy_of_the_checkout(how: str, target: Path) -> Path:
    """The checkout as a deploy would copy it: a tree copy keeping links (there must be none), `cp -rL`
    following them, `rsync -a`, or what `git archive` exports (a ZIP upload to cPanel's File Manager
    unpacks the same files)."""
    if how == "copytree":
        shutil.copytree(CHECKOUT, target, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    elif how == "git-archive":
        target.mkdir()
        archive = subprocess.run(["git", "-C", str(CHECKOUT), "archive", "--format=tar", "HEAD"], capture_output=True,
                                 check=True, timeout=120).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True, timeout=120)
        # The working tree's own state, not HEAD's: what is being tested is this change.
        shutil.rmtree(target / "cronbox")
        shutil.copytree(CHECKOUT / "cronbox", target / "cronbox", ignore=shutil.ignore_patterns(*NOT_SOURCES))
        shutil.copy2(CHECKOUT / "README.md", target / "README.md")
    else:
        target.mkdir()
        command = {"cp-rL": ["cp", "-rL"], "rsync": ["rsync", "-a"]}[how]
        for entry in CHECKOUT.iterdir():
            if not any(entry.match(pattern) for pattern in NOT_SOURCES):
                subprocess.run([*command, str(entry), str(target)], check=True, timeout=120)
    return target


def test_the_checkout_holds_no_links_and_ships_the_script_it_runs():
    """One real package folder: no symbolic link anywhere in the checkout (a copy without them must
    work), and the cron script at the root is the packaged one, byte for byte (`install-script .`
    refreshes it)."""
    links = [str(p.relative_to(CHECKOUT)) for p in CHECKOUT.rglob("*")
             if p.is_symlink() and not any(part in NOT_SOURCES for part in p.relative_to(CHECKOUT).parts)]
    assert links == []
    assert (CHECKOUT / SCRIPT).read_bytes() == (CHECKOUT / "cronbox" / "cron" / SCRIPT).read_bytes()


def test_the_old_top_level_names_are_unknown_modules_in_a_checkout():
    """`import outbox` (storage, cron) from the checkout's root fails as any unknown module does: there is
    no second copy of cronbox's modules to load under another name."""
    for name in ("outbox", "storage", "cron"):
        proc = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=str(CHECKOUT), capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
        assert proc.returncode == 1 and f"ModuleNotFoundError: No module named '{name}'" in proc.stderr, proc.stderr


@pytest.mark.parametrize("how", ["copytree", "cp-rL", "rsync", "git-archive"])
def test_every_copy_of_the_checkout_is_a_checkout_that_ticks(tmp_path, how):
    """The checkout is known by where the package is (beside app.py and the cron script), which survives
    every copy: the demo and a tick run in the copy, on its own embedded SQLite, importing the copy's
    modules."""
    if how == "rsync" and not shutil.which("rsync"):
        pytest.skip("rsync is not installed")  # CI installs it (.ci/run)
    if how == "git-archive" and not (CHECKOUT / ".git").exists():
        pytest.skip("not a git checkout")
    checkout = copy_of_the_checkout(how, tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "CRONBOX_APP_ROOT", "CRONBOX_APP", "CRONBOX_INSTANCE", "PYTHONPATH")}
    env.update(HOME=str(tmp_path), CRONBOX_HANDLERS="cronbox.cron.demo")
    where = subprocess.run([sys.executable, "-c", "import cronbox.outbox.core.settings as s; print(s.CHECKOUT)"],
                           cwd=str(tmp_path), env={**env, "PYTHONPATH": str(checkout)}, capture_output=True, text=True,
                           timeout=120)
    assert where.stdout.strip() == str(checkout.resolve()), where.stderr
    for command in (["demo"], ["tick", "--no-linger"]):
        done = subprocess.run([sys.executable, "-m", "cronbox", *command], cwd=str(tmp_path),
                              env={**env, "PYTHONPATH": str(checkout)}, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "tick: delivered 6" in done.stdout
    assert (checkout / "instance" / "cronbox.db").is_file()


def test_the_standalone_checkout_keeps_its_embedded_sqlite_default(tmp_path):
    """README's "Try it" command, as written, in a copy of the checkout made without links (its own venv,
    instance/)."""
    checkout = copy_of_the_checkout("cp-rL", tmp_path / "checkout")
    readme = (checkout / "README.md").read_text(encoding="utf-8")
    try_it = readme.split("## Try it", 1)[1]
    command = re.search(r"```sh\n(.+?)\n```", try_it, re.S).group(1)
    assert "python -m cronbox demo" in command and "python -m cronbox tick" in command
    from tests.package_helpers import pip_env

    env = {**pip_env(), "HOME": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    env.pop("CRONBOX_APP_ROOT", None)
    env.pop("CRONBOX_APP", None)
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # python3 as the README's reader has it
    done = subprocess.run(["/bin/sh", "-c", command], cwd=str(checkout), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tick: delivered 6" in done.stdout
    assert (checkout / "instance" / "cronbox.db").is_file()


def _tree(root: Path, *, skip=()) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if not any(part in skip or any(Path(part).match(x) for x in skip) for part in p.relative_to(root).parts)}


def test_building_the_wheel_and_installing_leave_the_checkout_as_it_was(build):
    """installed_build() ran `pip wheel` and `pip install` on its copy of this checkout, in the source
    folder as pip does: the build backend wrote nothing there (no build/, dist/ or *.egg-info). The copy
    holds exactly what was copied."""
    copied = {p.name for p in build.checkout.iterdir()}
    assert not {"build", "dist"} & copied and not [n for n in copied if n.endswith(".egg-info")], sorted(copied)
    assert copied == {p.name for p in CHECKOUT.iterdir() if not any(p.match(x) for x in NOT_SOURCES)}
    for package in PACKAGES:
        assert _tree(build.checkout / package) == _tree(CHECKOUT / package, skip=("__pycache__", "*.pyc"))


def test_pip_install_of_a_git_checkout_leaves_git_status_clean(tmp_path):
    """The issue's case as a user meets it: `pip install ./cronbox` from a clone, then `git status`."""
    from tests.package_helpers import pip_env

    checkout = tmp_path / "cronbox"
    shutil.copytree(CHECKOUT, checkout, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "clone"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    before = _tree(checkout, skip=(".git",))
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    done = subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "install", "--no-deps", "./cronbox"],
                          cwd=str(tmp_path), env=pip_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    status = subprocess.run([*git, "status", "--porcelain", "--ignored"], capture_output=True, text=True, check=True)
    assert status.stdout == ""
    assert _tree(checkout, skip=(".git",)) == before


def test_an_editable_install_imports_the_same_one_name(tmp_path):
    """`pip install -e` of a checkout: hatchling maps `cronbox` (and nothing else: dev-mode-exact) to the
    checkout's cronbox/. The same names as in the checkout and the wheel, and no other top-level name
    (issue 26): not outbox, storage or cron, nor the checkout's app, tests or bench. The venv borrows this
    one's dependencies through a .pth file."""
    source = tmp_path / "checkout"
    shutil.copytree(CHECKOUT, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "borrowed-dependencies.pth").write_text(ours + "\n")
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(source)],
                               capture_output=True, text=True, timeout=600, env=pip_env())
    assert installed.returncode == 0, installed.stderr
    probe = ("import importlib.util, cronbox, cronbox.outbox.core.clock, cronbox.cron.cli, cronbox.storage.format\n"
             "print(cronbox.__file__)\n"
             "print([n for n in ('outbox', 'storage', 'cron', 'app', 'tests', 'bench') if importlib.util.find_spec(n)])\n")
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run([str(python), "-c", probe], cwd=str(home), env=installed_env(home), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(source / "cronbox" / "__init__.py"), "[]"]
    for command in ([str(python), "-m", "cronbox", "--help"], [str(venv / "bin" / "cronbox"), "--help"]):
        shown = subprocess.run(command, cwd=str(home), env=installed_env(home), capture_output=True, text=True,
                               timeout=120)
        assert shown.returncode == 0 and "Usage: " in shown.stdout, shown.stderr
