"""cronbox's pytest plugin (the `pytest11` entry point `cronbox.testing.plugin`): fixtures, and nothing else.

Loaded in every pytest session of a virtualenv holding cronbox, it does nothing until a test asks for
one of its fixtures: no hook, and no import beyond this module and pytest's (the kit, SQLAlchemy and
Flask load inside the fixtures). `-p no:cronbox.testing.plugin` switches it off; the entry point has
the module's name, so `-p cronbox.testing.plugin` (a checkout not installed) or `pytest_plugins` naming
it as well loads it once.

    @pytest.fixture
    def cronbox_app(app):            # yours: the Flask app (or a cronbox Runtime) the kit runs on
        return app

    def test_receipt(client, cronbox_kit): ...       # manual mode
    def test_receipt_inline(client, cronbox_inline): ...
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import pytest

if TYPE_CHECKING:
    from cronbox.testing import Kit


@pytest.fixture
def cronbox_app() -> Any:
    """What the kit runs on: override it in your conftest.py to return your Flask app (set up with
    `Cronbox().init_app(app, db=db)`) or, outside Flask, a cronbox Runtime on your test database."""
    pytest.fail("cronbox.testing: define a fixture named cronbox_app returning your Flask app (set up with "
                "Cronbox().init_app(app, db=db)) or a cronbox Runtime, on your migrated test database", pytrace=False)


@pytest.fixture
def cronbox_session() -> Any:
    """The session inline mode watches, when it is not a Flask app's db.session: override it to return
    the sessionmaker (or scoped session) your code writes through."""
    return None


@pytest.fixture
def cronbox_kit(cronbox_app: Any) -> Iterator[Kit]:
    """A started kit in manual mode: nothing runs until the test calls deliver(), drain(), perform() or
    tick(); cronbox's clock frozen at the test's start; an empty outbox."""
    from cronbox.testing import Kit

    with Kit(cronbox_app) as kit:
        yield kit


@pytest.fixture
def cronbox_inline(cronbox_app: Any, cronbox_session: Any) -> Iterator[Kit]:
    """A started kit in inline mode: what a commit of the app's session records or dispatches runs right
    after the commit, in the test's process (and moving the clock runs what came due)."""
    from cronbox.testing import Kit

    with Kit(cronbox_app, mode="inline", session=cronbox_session) as kit:
        yield kit
