"""One-off runs without SSH: `migrate`, `queue retry --all`... asked for by a file, a command or the console.

Requests come from:
- `<instance>/run-once/*.cmd` files (one command per file, parsed with shlex; files younger
  than 10 s are left for the next tick, as File Manager may still be writing them; every file,
  garbage included, is recorded and moved to run-once/archive/);
- `once add COMMAND...`, or the operator console.
Only an allow-list of commands runs, never a shell: the argument list goes to
the same command line `python -m cronbox` has, in this process, with the tick's
runtime (and lock connection), under the command's own lock.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import secrets
import shlex
import stat
import time
from contextlib import redirect_stderr, redirect_stdout
from datetime import datetime
from typing import Callable
from pathlib import Path

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from cronbox.cron.scheduling.models import OnceRequest
from cronbox.outbox.core import clock, paging
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.budget import Budget

log = logging.getLogger("cronbox")
Q = OnceRequest.__table__

# Command prefixes that may run; the rest of the arguments are checked by the command itself.
ALLOWED = (
    ("migrate",),
    ("outbox", "retry"), ("outbox", "skip"), ("outbox", "prune"), ("outbox", "publish"), ("outbox", "status"),
    ("queue", "retry"), ("queue", "forget"), ("queue", "flush"), ("queue", "prune"), ("queue", "status"),
    ("queue", "failed"), ("queue", "resume"), ("queue", "groups"), ("queue", "profiles"), ("queue", "pools"),
    ("storage", "rewrap"), ("storage", "sweep"), ("storage", "verify"),
    ("schedule", "run"), ("schedule", "list"),
    ("health",),
)
FILE_MIN_AGE = 10.0  # seconds: File Manager may still be writing a younger file
FILE_MAX_BYTES = 4096
_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}
OUTPUT_MAX = 64 * 1024


def allowed(argv: list[str]) -> str | None:
    """None when allowed, else why not."""
    if not argv:
        return "empty command"
    if any(not isinstance(a, str) or "\x00" in a for a in argv):
        return "arguments must be plain text"
    for prefix in ALLOWED:
        if tuple(argv[:len(prefix)]) == prefix:
            return None
    names = ", ".join(" ".join(p) for p in ALLOWED)
    return f"{' '.join(argv[:2])!r} is not allowed as a one-off run (allowed: {names})"


def parse(text: str) -> tuple[list[str] | None, str | None]:
    """A command line as the operator would type it, minus a leading `python -m cronbox` or script name."""
    try:
        argv = shlex.split(text, comments=True)
    except ValueError as exc:
        return None, f"cannot parse the command: {exc}"
    for prefix in (["python", "-m", "cronbox"], ["python3", "-m", "cronbox"], ["./artisan_via_cron.sh"],
                   ["artisan_via_cron.sh"]):
        if argv[:len(prefix)] == prefix:
            argv = argv[len(prefix):]
    return argv, None


def add(session: Session, argv: list[str] | None, *, source: str, refused: str | None = None) -> OnceRequest:
    """Record a request: pending if allowed, else refused with the reason (either way it is kept)."""
    reason = refused or allowed(argv or [])
    row = OnceRequest(argv=json.dumps(argv or []), source=source[:255], status="refused" if reason else "pending",
                      reason=reason and reason[:500], requested_at=clock.utcnow())
    session.add(row)
    session.flush()
    return row


def collect_files(runtime) -> int:
    """Turn ripe *.cmd files into requests; returns how many were taken. The caller holds the once lock."""
    inbox = runtime.settings.instance / "run-once"
    taken = 0
    for path in ripe_files(inbox):
        claimed = _take(runtime, path)
        if claimed is None:
            continue  # gone meanwhile
        argv, problem = _read(claimed)
        request = in_transaction(runtime.sessions, lambda s: add(s, argv, source=f"file:{path.name}",
                                                                 refused=problem))
        log.info("once: request %s from file %s is %s%s", request.id, path.name, request.status,
                 f" ({request.reason})" if request.reason else "")
        taken += 1
    return taken


def ripe_files(inbox: Path) -> list[Path]:
    """*.cmd entries old enough to be complete (File Manager may still be writing a younger one).
    Symbolic links, folders and FIFOs named *.cmd are listed too (by their own mtime, never their
    target's): they are taken and refused with the reason, not left to be found again every tick."""
    if not inbox.is_dir():
        return []
    ripe = []
    for path in sorted(inbox.glob("*.cmd")):
        try:
            if time.time() - path.lstat().st_mtime >= FILE_MIN_AGE:
                ripe.append(path)
        except FileNotFoundError:
            continue
    return ripe


def _take(runtime, path: Path) -> Path | None:
    """Move a request file into the archive before reading it: the rename is the claim."""
    archive = runtime.settings.private_dir("run-once", "archive")
    target = archive / f"{clock.utcnow():%Y%m%dT%H%M%S}-{secrets.token_hex(3)}-{path.name}"
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return None
    return target


def _read(path: Path) -> tuple[list[str] | None, str | None]:
    """The command in a request file, or why it is refused. Only a regular file is read: a symbolic
    link could make cronbox read (and archive) a file the operator did not put in the inbox, a FIFO
    would block the tick forever on open or read, a device could be anything. O_NOFOLLOW refuses a
    link, O_NONBLOCK keeps a FIFO's open from waiting for a writer, fstat on the opened descriptor
    decides (no race between a check and the open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if path.is_symlink():
            return None, "not a regular file: a symbolic link (only plain .cmd files are read)"
        return None, f"cannot open the file: {exc.strerror}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, f"not a regular file: {_KINDS.get(stat.S_IFMT(info.st_mode), 'a special file')}"
        if info.st_size > FILE_MAX_BYTES:
            return None, f"file larger than {FILE_MAX_BYTES} bytes"
        with contextlib.suppress(OSError):  # archived among cronbox's private files (File Manager makes 0644)
            os.fchmod(fd, 0o600)
        raw = os.read(fd, FILE_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > FILE_MAX_BYTES:
        return None, f"file larger than {FILE_MAX_BYTES} bytes"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "file is not UTF-8 text"
    lines = [line for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if len(lines) != 1:
        return None, "a .cmd file holds exactly one command line" if lines else "empty command"
    return parse(lines[0])


def migrate_from_file(runtime, run_command: CommandRunner) -> bool:
    """The tick found the schema behind the code: is there a ripe `migrate` request file? Then run it
    now, before anything else (it cannot wait in the table: the table may not exist yet), and record
    it once the schema is there. Without this, a deploy with a new migration would leave a host
    without SSH with a tick that refuses to start and so never runs the request. The caller holds
    the tick lock; `migrate` takes its own."""
    for path in ripe_files(runtime.settings.instance / "run-once"):
        if _read(path)[0] != ["migrate"]:
            continue
        started = clock.utcnow()
        code, output = execute(runtime, run_command, ["migrate"])
        log.info("once: migrate from file %s before the tick, exit code %s", path.name, code)
        if code != 0:
            return False  # the file stays: the error is in the cronbox log and the next tick tries again
        _take(runtime, path)
        request = in_transaction(runtime.sessions, lambda s: add(s, ["migrate"], source=f"file:{path.name}"))
        _finish(runtime, request.id, "done", code, output, started=started)
        return True
    return False


def claim_next(session: Session) -> tuple[int, list[str]] | None:
    """Take the oldest pending request (status guard: each runs once even with two runners)."""
    row = session.execute(select(Q.c.id, Q.c.argv).where(Q.c.status == "pending").order_by(Q.c.id).limit(1)).first()
    if row is None:
        return None
    taken = session.execute(update(Q).where(Q.c.id == row.id, Q.c.status == "pending")
                            .values(status="running", started_at=clock.utcnow())).rowcount
    return (row.id, json.loads(row.argv)) if taken else None


# Runs a command line in this process: `run_command(argv, runtime=...)` -> exit code. The command
# tree is handed in by whoever starts the run (`cronbox.cron.cli.main`, or the root group of the command
# being run): the tree contains `once run` and `tick`, so importing it from here would be a cycle.
CommandRunner = Callable[..., int]


def execute(runtime, run_command: CommandRunner, argv: list[str]) -> tuple[int, str]:
    """Run a command line in this process with the given runtime; (exit code, output)."""
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = run_command(list(argv), runtime=runtime)
    return code, out.getvalue()


def run_pending(runtime, run_command: CommandRunner, budget: Budget | None = None) -> int:
    """Run pending requests one by one; each is recorded (table and log) and never run twice."""
    ran = 0
    while budget is None or budget.stop_reason() is None:
        claimed = in_transaction(runtime.sessions, claim_next)
        if claimed is None:
            break
        request_id, argv = claimed
        reason = allowed(argv)  # checked again: the table may have been written by hand
        if reason:
            code, output, status = 2, reason, "refused"
        else:
            try:
                code, output = execute(runtime, run_command, argv)
            except BaseException as exc:  # a bug in a command must not stop the tick
                code, output = 1, f"{type(exc).__name__}: {exc}"
            status = "done" if code == 0 else "failed"
        _finish(runtime, request_id, status, code, output)
        log.info("once: request %s (%s) %s with exit code %s", request_id, " ".join(argv)[:200], status, code)
        ran += 1
    return ran


def _finish(runtime, request_id: int, status: str, code: int, output: str, *, started=None) -> None:
    if len(output) > OUTPUT_MAX:
        output = output[:OUTPUT_MAX // 2] + "\n[... output cut ...]\n" + output[-OUTPUT_MAX // 2:]
    values = {"status": status, "exit_code": code, "output": output, "finished_at": clock.utcnow()}
    if started is not None:
        values["started_at"] = started
    in_transaction(runtime.sessions, lambda s: s.execute(update(Q).where(Q.c.id == request_id).values(values)))


def fail_interrupted(session: Session) -> int:
    """Requests left "running" by a process that died. Only call with the once lock held: then no
    other runner exists, and every running row is a leftover."""
    return session.execute(update(Q).where(Q.c.status == "running").values(
        status="failed", reason="interrupted: the process running it stopped before it finished",
        finished_at=clock.utcnow())).rowcount


class OnceStage:
    """The tick's stage: collect ripe files, then run what is pending, under the once lock (the same
    one `once run` takes: the two never take the same file or request)."""

    def __init__(self, runtime, run_command: CommandRunner):
        self.runtime = runtime
        self.run_command = run_command
        self.ran = 0

    def run(self, budget: Budget) -> int:
        inbox = self.runtime.settings.instance / "run-once"
        if not ripe_files(inbox) and not in_transaction(self.runtime.sessions, has_waiting):
            return 0  # the common case, every second while lingering: no lock round trips
        done = run_locked(self.runtime, self.run_command, budget)
        if done is None:
            return 0
        collected, ran = done
        self.ran += ran
        return collected + ran


def has_waiting(session: Session) -> bool:
    return session.scalar(select(Q.c.id).where(Q.c.status.in_(("pending", "running"))).limit(1)) is not None


def run_locked(runtime, run_command: CommandRunner, budget: Budget | None = None) -> tuple[int, int] | None:
    """(files collected, requests run) under the once lock, or None when another runner holds it."""
    lock = runtime.lock("once")
    if not lock.acquire():
        return None
    try:
        return run_holding_lock(runtime, run_command, budget)
    finally:
        lock.release()


def run_holding_lock(runtime, run_command: CommandRunner, budget: Budget | None = None) -> tuple[int, int]:
    interrupted = in_transaction(runtime.sessions, fail_interrupted)
    if interrupted:
        log.warning("once: %d requests were interrupted by a process that died; marked failed", interrupted)
    return collect_files(runtime), run_pending(runtime, run_command, budget)


def get(session: Session, request_id: int) -> OnceRequest | None:
    return session.get(OnceRequest, request_id)


def page(session: Session, cursor: tuple | None = None, *, size: int = paging.PAGE_SIZE) -> paging.Page:
    """Requests, newest first (cursor: the id), for `once list` and the console."""
    rows = select(Q.c.id, Q.c.argv, Q.c.source, Q.c.status, Q.c.exit_code, Q.c.reason, Q.c.requested_at,
                  Q.c.finished_at)
    return paging.page(session, rows, (Q.c.id,), cursor, size=size)


def prune(session: Session, before: datetime, batch: int = 500) -> int:
    ids = list(session.scalars(select(Q.c.id).where(Q.c.requested_at < before, Q.c.status.not_in(("pending",
                                                                                                    "running")))
                               .order_by(Q.c.id).limit(batch)))
    if ids:
        session.execute(delete(Q).where(Q.c.id.in_(ids)))
    return len(ids)
