"""The AMQP side (outbox/events: the publisher, the consumer, their messages) talks to py-amqp through
its public API only: no private attribute of another package's object (`message._serialize_properties()`,
`connection._transport`), as the import check (test_no_private_imports.py) cannot see those. Our own
objects' privates go through `self`, `cls` or `super()`."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN = ("self", "cls")


def private_attributes(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            value = node.value
            if isinstance(value, ast.Name) and value.id in OWN:
                continue
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                continue
            found.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_the_check_sees_a_private_attribute_of_another_object():
    assert private_attributes("amqp.Message(b'')._serialize_properties()")
    assert private_attributes("connection._transport.write(b'')")
    assert not private_attributes("self._batch.on_ack(1, False)")
    assert not private_attributes("super()._ack(item)")
    assert not private_attributes("channel.basic_publish(message, 'x', 'rk', mandatory=True)")


def test_the_amqp_modules_use_no_private_attribute_of_another_object():
    offenders = {str(p.relative_to(ROOT)): hits for p in sorted((ROOT / "cronbox" / "outbox" / "events").glob("*.py"))
                 if (hits := private_attributes(p.read_text(encoding="utf-8")))}
    assert offenders == {}


def transport_uses(source: str) -> list[str]:
    return [f"{node.lineno}: {ast.unparse(node)[:80]}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr == "transport"]


def test_the_amqp_modules_read_and_write_through_the_connection_not_its_transport():
    """py-amqp's Connection reads (blocking_read, drain_events), writes (the channels' methods) and
    shows its socket (sock); its transport object is how it does so, not ours to drive."""
    assert transport_uses("connection.transport.read_frame()")
    assert not transport_uses("connection.blocking_read(1.0)")
    offenders = {str(p.relative_to(ROOT)): hits for p in sorted((ROOT / "cronbox" / "outbox" / "events").glob("*.py"))
                 if (hits := transport_uses(p.read_text(encoding="utf-8")))}
    assert offenders == {}
