"""What a host app relies on when it embeds cronbox: CRONBOX_BASE_URL checked at start-up, every storage
error exported and documented, and cronbox's Alembic filter telling its tables from the host's."""
from __future__ import annotations

import inspect
import re

import pytest
from sqlalchemy import Column, Index, Integer, MetaData, Table

from cronbox import storage
from cronbox.cron import schema
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.settings import load_settings
from cronbox.storage import errors
from tests.conftest import APP_ROOT


def base_url(value: str) -> str | None:
    return load_settings(environ={"CRONBOX_BASE_URL": value, "CRONBOX_HANDLERS": ""}).base_url


@pytest.mark.parametrize("value, expected", [
    ("https://clinic.example", "https://clinic.example"),
    ("https://clinic.example/", "https://clinic.example"),
    ("HTTPS://clinic.example:8443/", "https://clinic.example:8443"),
    ("http://localhost:5000", "http://localhost:5000"),
    ("https://host.example/app", "https://host.example/app"),
    ("https://host.example/app/", "https://host.example/app"),
    ("https://host.example/a/b//", "https://host.example/a/b"),
    ("  https://clinic.example  ", "https://clinic.example"),  # .env values are stripped
    ("https://[2001:db8::1]/x", "https://[2001:db8::1]/x"),
])
def test_base_url_is_normalized(value, expected):
    assert base_url(value) == expected


@pytest.mark.parametrize("value", [
    "clinic.example",  # no scheme
    "//clinic.example",
    "ftp://clinic.example",
    "javascript://clinic.example/%0aalert(1)",
    "https://",
    "https:///path",
    "https://clinic.example?next=1",
    "https://clinic.example/?",
    "https://clinic.example#top",
    "https://clinic.example/#",
    "https://user:pw@clinic.example",
    "https://@clinic.example",
    "https://clinic.example:99999",
    "https://clinic.example:port",
    "https://clinic.example/a b",
    "https://clinic.example\\@evil.example",
    "https://clinic.example/\x00",
    "https://clinic.example/\u202e",
])
def test_bad_base_urls_are_refused_at_load_in_one_line(value):
    with pytest.raises(SettingsError) as caught:
        base_url(value)
    message = str(caught.value)
    assert message.startswith("CRONBOX_BASE_URL=") and "http(s)://host" in message and "\n" not in message


def test_base_url_unset_is_none():
    assert load_settings(environ={"CRONBOX_HANDLERS": ""}).base_url is None


def storage_errors() -> list[type]:
    return [cls for _name, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, errors.StorageError) and cls.__module__ == errors.__name__]


def test_every_storage_error_is_exported_and_documented():
    page = (APP_ROOT / "docs" / "howto" / "sealed-files.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(\w+)`", page, re.M))
    found = storage_errors()
    assert len(found) >= 8  # the root and its subclasses were all found
    for cls in found:
        assert getattr(storage, cls.__name__) is cls and cls.__name__ in storage.__all__, cls
        assert cls.__name__ in documented, f"{cls.__name__} is not in docs/howto/sealed-files.md's table of errors"


def test_the_alembic_filter_leaves_every_cronbox_table_and_what_is_on_it():
    for name in [*schema.metadata.tables, "cronbox_alembic_version", "cronbox_from_a_newer_version"]:
        assert not schema.include_name(name, "table", {"schema_name": None})
        assert not schema.include_object(None, name, "table", True, None)
        table = schema.metadata.tables.get(name)
        if table is not None:
            for column in table.columns:
                assert not schema.include_object(column, column.name, "column", False, None)
            for index in table.indexes:
                assert not schema.include_object(index, index.name, "index", False, None)
    host = MetaData()
    mine = Table("appointments", host, Column("id", Integer, primary_key=True), Column("cronbox_ref", Integer))
    index = Index("ix_cronbox_ref", mine.c.cronbox_ref)
    for name in ("appointments", "cronbox", "my_cronbox_events", "alembic_version"):
        assert schema.include_name(name, "table", {"schema_name": None})
    assert schema.include_name("cronbox_ref", "column", {"table_name": "appointments"})
    assert schema.include_object(mine, "appointments", "table", False, None)
    assert schema.include_object(mine.c.cronbox_ref, "cronbox_ref", "column", False, None)
    assert schema.include_object(index, "ix_cronbox_ref", "index", False, None)


def test_cronbox_app_comes_from_the_environment_then_the_app_roots_dotenv(tmp_path):
    """As every setting: set in the environment (even blank, which means unset) it wins over .env."""
    from cronbox.cron.hostapp import app_spec

    (tmp_path / ".env").write_text("CRONBOX_APP = 'clinic:create_app'  # the host\n")
    root = {"CRONBOX_APP_ROOT": str(tmp_path)}
    assert app_spec(root) == ("clinic:create_app", tmp_path.resolve())
    assert app_spec({**root, "CRONBOX_APP": " wsgi:app "}) == ("wsgi:app", tmp_path.resolve())
    assert app_spec({**root, "CRONBOX_APP": ""}) == (None, tmp_path.resolve())
    (tmp_path / ".env").write_text("CRONBOX_HANDLERS=clinic.handlers\n")
    assert app_spec(root) == (None, tmp_path.resolve())
