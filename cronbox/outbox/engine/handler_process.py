"""What a handler may do to the process it runs in, and what cronbox does about it.

Handlers run in cronbox's own process (a cron command, or the host's web process for
`POST /cron/tick`), so three things a handler does outlive its call unless cronbox undoes them:

- **A fork whose child comes back.** A child that returns or raises out of the handler would go on
  running the rest of the run: other items' handlers a second time, `finally` blocks and atexit
  hooks that close or release the parent's connections and lock over the sockets it shares with
  the parent, a second summary. So when a handler call returns or raises in another process than
  the one that made it, that child ends at once with `os._exit` (`leave_if_forked`), having flushed
  only its own output (the parent flushes its buffers before each call, so none is written twice).
  Its exit code is what Python would have given it: 0 after a return, SystemExit's code, 1 after
  any other exception. Children that end themselves (`os._exit`, multiprocessing's fork start
  method, the worker pool's own children, which never call back into a handler's caller) are
  untouched.
- **Signal dispositions.** A handler that sets SIGTERM or SIGINT (to SIG_IGN, SIG_DFL or a function
  of its own) would take the graceful stop away for the rest of the run; the dispositions the call
  found are put back when it ends (`SignalDispositions`), and so is SIGALRM's (the timeout's timer).
- **Non-daemon threads.** Python waits for them before a process exits, so a thread a handler left
  running would keep a cron process alive past its --max-time. The command is the process: when a
  cron command ends with such threads left, one line names them and the process ends with the
  command's exit code (`end_command_process`); the threads end with it. A web request never ends
  its process: there the request just returns.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from cronbox.outbox.core.logs import log_text
from cronbox.outbox.core.text import clean_text

log = logging.getLogger("cronbox")

# The signals whose dispositions a run relies on (StopSignals in run_loop, the pool's children).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
KEPT_SIGNALS = STOP_SIGNALS + (signal.SIGALRM,)  # the stop signals, and the handler timeout's timer


def flush_std_streams() -> None:
    """Write out what stdout and stderr buffer, so that a process forked next does not write it twice.
    Nearly always a no-op: the buffers are empty between handler calls."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed, or replaced by something without flush
            pass


def child_exit_code(raised: BaseException | None) -> int:
    """The exit code Python gives a process that ended this way (SystemExit's code; 1 for an error)."""
    if raised is None:
        return 0
    if isinstance(raised, SystemExit):
        code = raised.code
        if code is None:
            return 0
        return code & 0xFF if isinstance(code, int) else 1
    return 1


def leave_if_forked(caller_pid: int, raised: BaseException | None) -> None:
    """In a process forked by the handler (not the one with `caller_pid`): end it here, never
    returning into cronbox. Nothing of the parent's is touched: no `finally`, atexit hook or
    connection pool of cronbox runs; only this process's own stdout/stderr are flushed."""
    if os.getpid() == caller_pid:
        return
    code = child_exit_code(raised)
    try:
        log.warning("a handler's forked child (pid %d) came back into cronbox; it exits with code %d "
                    "(a child must end itself with os._exit)", os.getpid(), code)
        for handler in log.handlers:
            handler.flush()
    except BaseException:  # nothing may keep this process from ending here
        pass
    flush_std_streams()
    os._exit(code)


class SignalDispositions:
    """The dispositions of the stop signals and SIGALRM (the timeout's) before a handler call, put back
    after it if changed.
    Main thread only (signals can only be set there). Identity is compared through the public
    signal.getsignal (SIG_IGN/SIG_DFL come back as the same enum members each time); the private
    _signal module it wraps would save an enum look-up per call, but our rule forbids private names.
    A read of a Python-level handler costs a few µs (the enum look-up fails and raises): each
    disposition is read once after each call, and once before the calls (`before`, which cronbox's
    own installs update: `install`): before each call, or once for the calls of a runner's batch,
    between which only the runner's own writes run (what each call puts back is the next one's
    `before`)."""

    __slots__ = ("before",)

    def __init__(self):
        self.before = {sig: signal.getsignal(sig) for sig in KEPT_SIGNALS}

    def install(self, sig: int, handler) -> None:
        """Set `sig`'s handler before the call: what is put back after it."""
        signal.signal(sig, handler)
        self.before[sig] = handler

    def restore(self, fn) -> None:
        """After the handler `fn`'s call: put back what it changed (one line each, naming it)."""
        for sig, disposition in self.before.items():
            if signal.getsignal(sig) is not disposition and disposition is not None:
                signal.signal(sig, disposition)
                log.warning("handler %s changed the %s handler; cronbox's is back in place", _handler_name(fn),
                            signal.Signals(sig).name)


def _handler_name(fn) -> str:
    """A handler's name for a log line."""
    return clean_text(str(getattr(fn, "__qualname__", None) or type(fn).__name__), 200)


def leftover_threads(before: set[threading.Thread] | None = None) -> list[threading.Thread]:
    """Non-daemon threads still running besides the main thread (and besides those in `before`, the
    threads the command found when it started): Python would wait for them at exit."""
    main = threading.main_thread()
    return [t for t in threading.enumerate()
            if t is not main and not t.daemon and t.is_alive() and (before is None or t not in before)]


def end_command_process(code: int, before: set[threading.Thread] | None = None) -> int:
    """End a cron command's process with `code`: at once, not after the non-daemon threads a handler
    left running (a host counts every live process against its entry-process limit). Returns `code`
    when there are none (the normal exit then runs as usual). Never called inside a web request."""
    threads = leftover_threads(before)
    if not threads:
        return code
    names = log_text(", ".join(sorted(str(t.name) for t in threads)), 500)
    log.warning("ending the process with %d non-daemon thread(s) a handler left running (%s); they end with it",
                len(threads), names)
    logging.shutdown()  # flush and close the log files
    flush_std_streams()
    os._exit(code)

