"""A broker message's fields reach the operator twice: in cronbox's log file (`amqp consume`) and on
the terminal (`amqp dead`). Whatever a publisher puts in its message_id, type, key or headers (CR,
LF, escape sequences, other C0/C1 controls, DEL, U+2028, bidi overrides) neither forges a log line
nor reaches the terminal as it is: every field passes clean_text."""
from __future__ import annotations

import json
import re

import amqp
import pytest

from cronbox.outbox.core.text import UNSHOWABLE
from tests.conftest import run_cli
from tests.processes.test_consume_processes import setup  # noqa: F401  (fixture)

# How `amqp consume` prints what it does: the server behind the inbox changes nothing, so not PostgreSQL
# too (.ci/run's 30 minutes; consume and its inbox run on it in test_consume and test_consume_processes).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

NASTY = ["\r", "\n", "\r\n2026-01-01 00:00:00 INFO forged line", "\x1b[2J\x1b[31m", "\x1b]0;title\x07", "\x00",
         "\x08\x7f", "\x85\x9b", "\u2028", "\u2029", "\u202e", "\u2066", "\u061c\u200f"]
SHOWN_BADLY = re.compile(f"(?![\\n])[{UNSHOWABLE}]")  # line ends are the only control characters allowed


def publish(rabbit, queue, *, message_id, type_="amqp.write", key=None, reason=None, n=0, **payload):
    headers = {"x-trace-id": "tr"}
    if key is not None:
        headers["x-event-key"] = key
    if reason is not None:
        headers["x-cronbox-reason"] = reason
    rabbit.channel.basic_publish(amqp.Message(json.dumps({"n": n, **payload}), content_type="application/json",
                                              delivery_mode=2, message_id=message_id, type=type_,
                                              application_headers=headers), exchange="", routing_key=queue)


def test_no_field_of_a_message_forges_a_log_line_or_reaches_the_terminal(setup, rabbit, tmp_path):
    env, queue, _calls = setup
    for i, s in enumerate(NASTY):
        publish(rabbit, queue, message_id=f"m{i}{s}x", key=f"k{s}", permanent=1, n=i)  # parked by consume.a
        publish(rabbit, queue, message_id=f"b{i}{s}", type_=f"t{s}", key=f"k{s}", n=i)  # bad: no such type
    consumed = run_cli(env, "amqp", "consume", "--queue", queue, "--max-messages", str(2 * len(NASTY)))
    assert consumed.returncode == 0, consumed.stderr[-2000:]
    log = "".join(p.read_text() for p in (tmp_path / "instance" / "logs").glob("*.log"))
    lines = [line for line in log.splitlines() if f"queue={queue}" in line]
    assert len(lines) == 2 * len(NASTY)  # one line per message, none cut in two
    assert not SHOWN_BADLY.search(log), SHOWN_BADLY.search(log)
    assert "forged line" not in "".join(line for line in log.splitlines() if line.startswith("2026-01-01"))
    listed = run_cli(env, "amqp", "dead", "--queue", queue)
    assert listed.returncode == 0, listed.stderr
    assert not SHOWN_BADLY.search(listed.stdout), SHOWN_BADLY.search(listed.stdout)
    assert len(listed.stdout.strip().splitlines()) == 1 + 2 * len(NASTY)  # the header and one row each
    assert "\\x1b[2J" in listed.stdout and "\\u202e" in listed.stdout  # shown escaped, not dropped


def test_a_reason_header_a_publisher_set_is_shown_clean_by_amqp_dead(setup, rabbit):
    env, queue, _calls = setup
    dead = f"{queue}.dead"
    rabbit.channel.queue_declare(dead, durable=True, auto_delete=False)
    for i, s in enumerate(NASTY):
        publish(rabbit, dead, message_id=f"m{i}", reason=f"why{s}not", key=f"k{s}")
    listed = run_cli(env, "amqp", "dead", "--queue", queue)
    assert listed.returncode == 0, listed.stderr
    assert not SHOWN_BADLY.search(listed.stdout)
    assert len(listed.stdout.strip().splitlines()) == 1 + len(NASTY)


@pytest.mark.parametrize("name", ["q\x1b[2J", "q\nerror: forged", "q\u202eeman", "q\x7f", "q\u2028x"])
def test_a_queue_name_with_control_characters_is_a_usage_error_shown_clean(setup, name):
    env, _queue, _calls = setup
    for args in (["consume"], ["dead"], ["retry-dead", "--all"]):
        proc = run_cli(env, "amqp", *args, "--queue", name)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "is not a queue name" in lines[0], proc.stderr
        assert not SHOWN_BADLY.search(proc.stderr)


UNREADABLE_PROPERTIES = [{"message_id": b"\xff\x1b[2J", "type": b"amqp.write"},  # not UTF-8
                         {"message_id": b"m-t",  # a header timestamp past any calendar
                          "application_headers": [(b"when", ("T", 2**64 - 1))]}]


@pytest.mark.parametrize("props", UNREADABLE_PROPERTIES, ids=["not-utf8", "timestamp"])
@pytest.mark.parametrize("where", [0, 1, 3], ids=["first", "second", "last"])
def test_a_message_py_amqp_cannot_read_in_the_dead_queue_is_listed_and_stays_and_the_rest_move_on(
        where, props, setup, rabbit):
    """Put straight into Q.dead by another publisher (amqp consume parks such a message readable)."""
    from tests.db.test_consume_bad_messages import publish_raw

    env, queue, _calls = setup
    dead = f"{queue}.dead"
    rabbit.channel.queue_declare(dead, durable=True, auto_delete=False)
    for i in range(3):
        if i == where:
            assert publish_raw(rabbit, dead, b"{}", props)
        publish(rabbit, dead, message_id=f"m{i}", reason="why")
    if where == 3:
        assert publish_raw(rabbit, dead, b"{}", props)
    listed = run_cli(env, "amqp", "dead", "--queue", queue)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.strip().splitlines()[1:]
    assert len(rows) == 4 and not SHOWN_BADLY.search(listed.stdout)
    assert "unreadable by py-amqp (delivery" in rows[where] and "2 bytes" in rows[where]
    assert [r.split()[0] for i, r in enumerate(rows) if i != where] == ["m0", "m1", "m2"]
    moved = run_cli(env, "amqp", "retry-dead", "--all", "--queue", queue)
    lines = moved.stderr.strip().splitlines()
    assert moved.returncode == 1 and len(lines) == 1 and "py-amqp cannot read stay in" in lines[0], moved.stderr
    assert "retry-dead: 3 messages moved back" in moved.stdout and not SHOWN_BADLY.search(moved.stderr)
    assert rabbit.channel.queue_declare(dead, passive=True)[1] == 1  # the unreadable one, still there
    assert rabbit.channel.queue_declare(queue, passive=True)[1] == 3


def test_retry_dead_by_id_moves_a_readable_message_behind_an_unreadable_one(setup, rabbit):
    from tests.db.test_consume_bad_messages import publish_raw

    env, queue, _calls = setup
    dead = f"{queue}.dead"
    rabbit.channel.queue_declare(dead, durable=True, auto_delete=False)
    assert publish_raw(rabbit, dead, b"{}", UNREADABLE_PROPERTIES[0])
    publish(rabbit, dead, message_id="m0", reason="why")
    moved = run_cli(env, "amqp", "retry-dead", "--message-id", "m0", "--queue", queue)
    assert moved.returncode == 0 and "retry-dead: 1 messages moved back" in moved.stdout, moved.stderr
    assert rabbit.channel.queue_declare(dead, passive=True)[1] == 1
