"""Operator logs: one line per event, in <instance>/logs/cronbox-YYYY-MM-DD.log (UTC dates).

Shared-host operators read these through File Manager, so lines are short and
carry ids and a trace id, never PHI, phone numbers, message bodies or tokens
(see `mask_phone`, and `mask_text` for texts we do not control,
such as a handler's exception message).
"""
from __future__ import annotations

import logging
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

LOGGER = "cronbox"


class DailyFileHandler(logging.Handler):
    """Appends to the day's file, switching files at UTC midnight even in a long run."""

    def __init__(self, folder: Path, prefix: str = "cronbox"):
        super().__init__()
        self.folder = folder
        self.prefix = prefix
        self._day: str | None = None
        self._day_span = (0.0, 0.0)  # the open file's day, [start, end) in Unix seconds
        self._stream = None
        self._failing = False  # the last write failed and stderr was told

    def _file_for(self, created: float):
        """The file of the UTC day of `created` (a record's Unix time): the open one while the day
        lasts (a run writes a line per item: no date is made for each)."""
        start, end = self._day_span
        if self._stream is not None and start <= created < end:
            return self._stream
        moment = datetime.fromtimestamp(created, timezone.utc)
        day = moment.strftime("%Y-%m-%d")
        if day != self._day:
            if self._stream is not None:
                self._stream.close()
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = self.folder / f"{self.prefix}-{day}.log"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._stream = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
            self._day = day
        midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
        self._day_span = (midnight, midnight + 86400.0)
        return self._stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._file_for(record.created).write(self.format(record) + "\n")
            self._failing = False
        except OSError as exc:
            self._write_failed(exc)
        except Exception:
            self.handleError(record)

    def _write_failed(self, exc: OSError) -> None:
        """A full disk or a broken folder must not stop the run, nor print a traceback per record to
        stderr (cron mails it): say it once on stderr, drop lines until a write succeeds again."""
        stream, self._stream, self._day = self._stream, None, None  # reopened (and retried) on the next record
        if stream is not None:
            try:
                stream.close()  # flushing the line again fails; the descriptor is closed anyway
            except OSError:
                pass
        if not self._failing:
            self._failing = True
            sys.stderr.write(f"cronbox: cannot write the log in {self.folder} ({exc.strerror or exc}); "
                             "log lines are dropped until it can\n")

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
            self._day = None
        super().close()


class UtcFormatter(logging.Formatter):
    converter = time.gmtime

    def __init__(self):
        super().__init__("%(asctime)s.%(msecs)03dZ %(levelname)s [%(process)d] %(message)s", "%Y-%m-%dT%H:%M:%S")
        self._second: tuple[int, str] = (-1, "")  # the last second formatted, and its text

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """The record's second (its milliseconds are the format's), made once a second: a run writes
        a line per item, many a second."""
        second = int(record.created)
        last = self._second
        if last[0] == second and datefmt == self.datefmt:
            return last[1]
        text = super().formatTime(record, datefmt)
        if datefmt == self.datefmt:
            self._second = (second, text)
        return text


class StderrHandler(logging.StreamHandler):
    """The same lines on standard error, for a supervisor that keeps them (systemd's journal):
    CRONBOX_LOG_STDERR=on. Off by default: cron mails whatever a job writes there."""

    def __init__(self):
        super().__init__(sys.stderr)


def configure_logging(logs_dir: Path, *, level: int = logging.INFO, stderr: bool = False) -> logging.Logger:
    """Attach the daily file handler once per folder, and the stderr one when asked (idempotent:
    commands and the app both call it)."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level)
    logger.propagate = False
    has_file = False
    for handler in list(logger.handlers):
        if isinstance(handler, DailyFileHandler) and handler.folder == logs_dir:
            has_file = True
        elif isinstance(handler, DailyFileHandler) or (isinstance(handler, StderrHandler) and not stderr):
            logger.removeHandler(handler)
            handler.close()
    if not has_file:
        handler = DailyFileHandler(logs_dir)
        handler.setFormatter(UtcFormatter())
        logger.addHandler(handler)
    if stderr and not any(isinstance(h, StderrHandler) for h in logger.handlers):
        handler = StderrHandler()
        handler.setFormatter(UtcFormatter())
        logger.addHandler(handler)
    return logger


class LimitedLines:
    """Log lines of one kind that an outsider can cause at will (a forged message on a broker queue, one
    line each): at most `per_window` of them every `window` seconds, the rest only counted, and one
    line saying how many were left out once their window has ended. A flood costs a bounded number of
    lines; a long run still shows every burst, and the count is never lost: `flush()` is called when
    the run is idle (the window over: say it) and when it stops (`final`: say it now)."""

    def __init__(self, logger: logging.Logger, what: str, *, per_window: int = 10, window: float = 60.0,
                 level: int = logging.WARNING, monotonic=time.monotonic):
        self.logger, self.what, self.level = logger, what, level
        self.per_window, self.window = per_window, window
        self._monotonic = monotonic
        self._started: float | None = None  # the current window's start
        self._shown = 0  # lines logged in it
        self.left_out = 0  # lines counted instead, not yet summed up in a line

    def log(self, message: str, *args) -> None:
        now = self._monotonic()
        if self._started is None or now - self._started >= self.window:
            self.flush(final=True)
            self._started, self._shown = now, 0
        if self._shown < self.per_window:
            self._shown += 1
            self.logger.log(self.level, message, *args)
        else:
            self.left_out += 1

    def flush(self, *, final: bool = False) -> None:
        """The line saying how many were left out, once their window has ended (or now: `final`)."""
        if not self.left_out or not (final or self._monotonic() - self._started >= self.window):
            return
        self.logger.log(self.level, "%s: %d more not logged (at most %d lines every %.0fs)", self.what,
                        self.left_out, self.per_window, self.window)
        self.left_out = 0


def mask_phone(number: str | None) -> str:
    """+989121234567 -> +98*******567: enough to tell numbers apart, not to dial one."""
    if not number:
        return ""
    digits = str(number)
    if len(digits) <= 5:
        return "*" * len(digits)
    return digits[:3] + "*" * (len(digits) - 6) + digits[-3:]


# 7+ digits, optionally after "+", with up to two spaces, dashes or parentheses between them; not
# starting inside a longer number, and not an ISO date (2026-11-30), which is no phone number.
_PHONE = re.compile(r"(?<![\d+])(?!\d{4}-\d\d-\d\d(?!\d))\+?\d(?:[ ()\-]{0,2}\d){6,}")
_EMAIL = re.compile(r"[\w.%+-]+@[\w-]+(?:\.[\w-]+)+")


def mask_text(text: str | None) -> str:
    """Free text (an exception message) with anything that looks like a phone number or an
    e-mail address masked: +98 912 123 4567 -> +98*******567, jane@example.com -> j***@***."""
    if not text:
        return ""
    text = _EMAIL.sub(lambda m: m.group()[0] + "***@***", text)
    return _PHONE.sub(lambda m: mask_phone(re.sub(r"[^\d+]", "", m.group())), text)


def log_text(text: str | None, limit: int = 300) -> str:
    """A handler's error for a log line: masked first, then cut (cutting first could leave a
    number too short to be recognised)."""
    return mask_text(text)[:limit]
