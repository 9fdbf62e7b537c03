"""The AMQP side (the publisher, the consumer, the job worker and their messages) talks to py-amqp
through its connection and channels only: its transport object is how py-amqp reads and writes, not
ours to drive. (A private attribute of another package's object, `connection._transport`, is refused
everywhere by test_no_private_attribute_access.py.)"""
from __future__ import annotations

import ast

from tests.source_tree import shipped


def transport_uses(nodes) -> list[str]:
    return [f"{node.lineno}: {ast.unparse(node)[:80]}" for node in nodes
            if isinstance(node, ast.Attribute) and node.attr == "transport"]


def test_the_amqp_modules_read_and_write_through_the_connection_not_its_transport():
    """py-amqp's Connection reads (blocking_read, drain_events), writes (the channels' methods) and
    shows its socket (sock); its transport object is how it does so, not ours to drive."""
    assert transport_uses(ast.walk(ast.parse("connection.transport.read_frame()")))
    assert not transport_uses(ast.walk(ast.parse("connection.blocking_read(1.0)")))
    offenders = {source.relative: hits for source in shipped() if (hits := transport_uses(source.nodes))}
    assert offenders == {}
