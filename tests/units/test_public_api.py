"""cronbox's public API is what `cronbox` itself exports (issue 26): each name resolves to the object
the docs describe, and importing cronbox (every process does, a tick included) loads no Flask."""
from __future__ import annotations

import pytest

import cronbox
from tests.conftest import APP_ROOT

PUBLIC = {
    "Cronbox": "cronbox.web.extension", "record": "cronbox.outbox.events.record",
    "consumer": "cronbox.outbox.events.consumers", "forward": "cronbox.outbox.events.forward",
    "forward_jobs": "cronbox.outbox.queue.forward_jobs", "celery_task": "cronbox.outbox.queue.forward_jobs",
    "Event": "cronbox.outbox.engine.context", "Context": "cronbox.outbox.engine.context",
    "job": "cronbox.outbox.queue.jobs", "send_sms": "cronbox.outbox.channels.jobs",
    "send_email": "cronbox.outbox.channels.jobs", "send_webhook": "cronbox.outbox.channels.jobs",
    "notify": "cronbox.outbox.channels.jobs", "CronboxError": "cronbox.outbox.core.errors",
    "RetryLater": "cronbox.outbox.core.errors", "PermanentFailure": "cronbox.outbox.core.errors",
    "seal_upload": "cronbox.web.uploads", "sealed_upload_route": "cronbox.web.uploads",
    "upload_csrf_token": "cronbox.web.hostauth", "request_client": "cronbox.web.uploads", "UploadRefused": "cronbox.web.uploads",
    "BodyAlreadyRead": "cronbox.web.uploads", "CsrfNotChecked": "cronbox.web.hostcsrf",
    "alembic_include_name": "cronbox.cron.schema", "alembic_include_object": "cronbox.cron.schema",
    "batch": "cronbox.outbox.queue.batches", "chain": "cronbox.outbox.queue.batches",
    "cancel_batch": "cronbox.outbox.queue.batches", "Batch": "cronbox.outbox.queue.batches",
    "Chain": "cronbox.outbox.queue.batches", "Progress": "cronbox.outbox.queue.batches",
    "JobResult": "cronbox.outbox.queue.results", "chain_progress": "cronbox.outbox.queue.chains",
    "ChainProgress": "cronbox.outbox.queue.chains", "ChainStep": "cronbox.outbox.queue.chains",
}


def test_all_is_the_documented_api():
    assert sorted(cronbox.__all__) == sorted([*PUBLIC, "schedule"])
    assert set(cronbox.__all__) <= set(dir(cronbox))


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_name_is_the_object_its_module_defines(name):
    value = getattr(cronbox, name)
    assert value.__module__ == PUBLIC[name]


def test_schedule_is_the_module_of_the_decorators():
    from cronbox.cron.scheduling import schedule
    assert cronbox.schedule is schedule and callable(schedule.every) and callable(schedule.cron)


def test_a_handlers_signals_are_not_cronboxs_errors():
    """RetryLater and PermanentFailure are what a handler raises to say how its attempt ended;
    CronboxError is the root of what cronbox itself raises (bad settings, a lost lock...)."""
    for signal in (cronbox.RetryLater, cronbox.PermanentFailure):
        assert issubclass(signal, Exception) and not issubclass(signal, cronbox.CronboxError)
    from cronbox.outbox.core.errors import LockLost, SettingsError
    assert issubclass(SettingsError, cronbox.CronboxError) and issubclass(LockLost, cronbox.CronboxError)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'recordd'"):
        cronbox.recordd  # noqa: B018


EXAMPLE_APP = [p for folder in ("clinic", "migrations") for p in sorted((APP_ROOT / "examples" / "clinic" / folder).rglob("*.py"))]


def cronbox_imports(path) -> list[str]:
    """Every name `path` takes from cronbox, as `module.name` (or the module, for `import cronbox.x`)."""
    return cronbox_imports_in(path.read_text(encoding="utf-8"))


def cronbox_imports_in(source: str) -> list[str]:
    import ast
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "cronbox":
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "cronbox"]
    return found


def test_the_example_app_imports_public_names_only():
    """examples/clinic's app and its Alembic env (what a user copies) use `cronbox`'s own names and its
    documented subpackage `cronbox.storage`, nothing internal. Its tests read cronbox's tables through
    the models, as a test may."""
    assert len(EXAMPLE_APP) >= 5
    allowed = {f"cronbox.{name}" for name in cronbox.__all__} | {"cronbox.storage"}
    used = {f"{path.relative_to(APP_ROOT)}: {name}" for path in EXAMPLE_APP for name in cronbox_imports(path)}
    assert used, "the check sees the example's imports"
    assert {u for u in used if u.split(": ")[1] not in allowed} == set()


def test_the_check_sees_an_internal_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from cronbox.client import client_ip\nimport cronbox.storage.audit\nfrom cronbox import Cronbox\n")
    assert cronbox_imports(probe) == ["cronbox.client.client_ip", "cronbox.storage.audit", "cronbox.Cronbox"]


def test_the_docs_python_blocks_import_public_names_only():
    """The docs teach the public API: every `cronbox` import in the Python blocks of README.md and docs/
    (those that parse alone; an abridged excerpt starts indented) is a name of `cronbox.__all__` or
    `cronbox.storage`."""
    from tests.docs_snippets import all_blocks

    used = []
    for block in all_blocks():
        if block.language != "python":
            continue
        try:
            used += cronbox_imports_in(block.code)
        except SyntaxError:
            continue
    allowed = {f"cronbox.{name}" for name in cronbox.__all__} | {"cronbox.storage"}
    assert len(used) >= 10, used
    assert sorted(set(used) - allowed) == []


def test_the_type_checkers_imports_are_the_lazy_table():
    """cronbox/__init__.py names each export twice: in `_EXPORTS` (loaded on first use) and under
    `if TYPE_CHECKING:` (what a type checker and an editor see). Both must say the same thing."""
    import ast
    from importlib.util import find_spec

    tree = ast.parse((APP_ROOT / "cronbox" / "__init__.py").read_text(encoding="utf-8"))
    [guarded] = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING"]
    seen = {}
    for node in guarded.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1
        for alias in node.names:
            module = f".{node.module}"
            try:  # `schedule`: the module itself
                is_module = find_spec(f"cronbox{module}.{alias.name}") is not None
            except ModuleNotFoundError:  # the parent is a module, not a package: a name in it
                is_module = False
            seen[alias.asname or alias.name] = (f"{module}.{alias.name}", None) if is_module else (module, alias.name)
    assert seen == cronbox._EXPORTS


def test_the_type_checkers_usage_file_is_valid_python_that_runs_nothing_on_import():
    """tests/typing/public_api.py is what .ci/run's mypy checks: importable, every public name it uses real."""
    import importlib

    usage = importlib.import_module("tests.typing.public_api")
    assert {"set_up", "handlers", "in_a_request"} <= set(vars(usage))


def test_each_public_name_has_one_spelling():
    """cronbox.outbox keeps what only it has (settings, the runtime, a few errors): the names cronbox
    exports are cronbox's alone (issue 36), and the old second spelling is an AttributeError."""
    import cronbox.outbox

    assert set(cronbox.outbox.__all__).isdisjoint(cronbox.__all__)
    assert set(cronbox.outbox.__all__) <= set(dir(cronbox.outbox))
    for name in ("record", "consumer", "forward", "job", "Context", "Event", "RetryLater", "PermanentFailure"):
        with pytest.raises(AttributeError):
            getattr(cronbox.outbox, name)
