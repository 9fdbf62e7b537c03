"""Where the app root is (outbox/core/settings.py find_app_root), from this checkout.

The installed side (no checkout to fall back on, the refusal) runs in a real venv in
tests/processes/test_package.py; here, the order of the rules and the checkout's own default.
"""
from __future__ import annotations

import pytest

from cronbox.outbox.core.settings import CHECKOUT, find_app_root, is_checkout, load_settings


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_the_checkout_is_the_standalone_apps_root_wherever_it_is_run_from(cwd):
    assert is_checkout() and find_app_root({}) == CHECKOUT
    settings = load_settings(environ={})
    assert settings.app_root == CHECKOUT
    assert settings.database_url == f"sqlite:///{CHECKOUT / 'instance' / 'cronbox.db'}"  # the embedded default


def test_a_bare_dotenv_in_the_working_folder_does_not_move_the_checkouts_root(cwd):
    (cwd / ".env").write_text("SOMETHING_ELSE=1\n")  # cron's $HOME may hold another tool's .env
    assert find_app_root({}) == CHECKOUT


def test_the_folder_holding_the_cron_script_wins_over_the_checkout(cwd):
    """A host app on an editable install of this checkout runs from its own folder."""
    (cwd / "artisan_via_cron.sh").write_text("#!/bin/sh\n")
    assert find_app_root({}) == cwd.resolve()
    assert load_settings(environ={}).instance == cwd.resolve() / "instance"


def test_cronbox_app_root_wins_over_everything(cwd, tmp_path):
    (cwd / "artisan_via_cron.sh").write_text("#!/bin/sh\n")
    assert find_app_root({"CRONBOX_APP_ROOT": str(tmp_path / "elsewhere")}) == (tmp_path / "elsewhere").resolve()
    assert find_app_root({"CRONBOX_APP_ROOT": "  "}) == cwd.resolve()  # blank means unset
