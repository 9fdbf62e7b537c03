"""call_handler, the one place cronbox calls user code (consumers, jobs, tasks, `amqp consume`'s
consumers), in this very process: a forked child never returns from it, and the stop signals'
dispositions are what they were before the call."""
from __future__ import annotations

import os
import signal
import sys

import pytest

from cronbox.outbox.engine.handler_call import call_handler


# The fork is this test's own (a handler that forks), made in pytest-xdist's worker, which runs
# execnet's thread: Python 3.12+ warns about any fork in a threaded process. cronbox's own fork (the
# pool's, outbox/queue/pool.py) is made before the child starts its only thread.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
@pytest.mark.parametrize("leave,code", [(lambda: None, 0), (lambda: sys.exit(5), 5), (lambda: sys.exit("bye"), 1),
                                        (lambda: 1 / 0, 1), (lambda: (_ for _ in ()).throw(KeyboardInterrupt), 1)])
def test_a_forked_child_ends_where_the_handler_call_ends(tmp_path, leave, code):
    returned = tmp_path / "returned"
    children = []

    def handler():
        pid = os.fork()
        if pid == 0:
            return leave()
        children.append(pid)

    outcome = call_handler(handler, (), timeout=10)
    # only the parent gets here: a child that came back would write the file and go on with pytest
    returned.open("a").write(f"{os.getpid()}\n")
    [child] = children
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == code
    assert outcome.ok
    assert returned.read_text().split() == [str(os.getpid())]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("disposition", [signal.SIG_IGN, signal.SIG_DFL, lambda *_: None])
def test_the_stop_signals_are_put_back_after_the_call(sig, disposition):
    def ours(signum, frame):
        pass

    previous = signal.signal(sig, ours)
    try:
        outcome = call_handler(lambda: signal.signal(sig, disposition), (), timeout=10)
        assert outcome.ok
        assert signal.getsignal(sig) is ours
    finally:
        signal.signal(sig, previous)
