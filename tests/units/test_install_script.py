"""The cron line `install-script` prints (the copy itself runs in tests/processes/test_package.py)."""
from __future__ import annotations

from pathlib import Path

from cronbox.cron.commands.install_script import cron_line

APP = Path("/home/u/clinic")


def test_the_line_names_the_python_unless_the_script_finds_it_by_itself():
    script = APP / "artisan_via_cron.sh"
    assert cron_line(script, "/home/u/clinic/.venv/bin/python") == "* * * * * /home/u/clinic/artisan_via_cron.sh tick"
    assert cron_line(script, "/home/u/clinic/venv/bin/python") == "* * * * * /home/u/clinic/artisan_via_cron.sh tick"
    # any interpreter of the app's own virtualenv: the script runs the same one (issue 37: venv/bin/python3
    # printed a CRONBOX_PYTHON= the docs' line did not have)
    for name in ("python3", "python3.11"):
        for venv in ("venv", ".venv"):
            assert cron_line(script, f"/home/u/clinic/{venv}/bin/{name}") == (
                "* * * * * /home/u/clinic/artisan_via_cron.sh tick")
    assert cron_line(script, "/home/u/clinic/venv/lib/python") == (
        "* * * * * CRONBOX_PYTHON=/home/u/clinic/venv/lib/python /home/u/clinic/artisan_via_cron.sh tick")
    assert cron_line(script, "/home/u/virtualenv/clinic/3.11/bin/python") == (
        "* * * * * CRONBOX_PYTHON=/home/u/virtualenv/clinic/3.11/bin/python /home/u/clinic/artisan_via_cron.sh tick")
    assert cron_line(script, "") == cron_line(script, None) == "* * * * * /home/u/clinic/artisan_via_cron.sh tick"


def test_the_line_survives_the_shell_and_crons_percent_signs():
    line = cron_line(Path("/home/u/my app 100%/artisan_via_cron.sh"), "/opt/py 3/bin/python")
    assert line == "* * * * * CRONBOX_PYTHON='/opt/py 3/bin/python' '/home/u/my app 100\\%/artisan_via_cron.sh' tick"
