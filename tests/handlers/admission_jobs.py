"""Jobs for the admission tests (CRONBOX_HANDLERS=tests.handlers.admission_jobs).

admission.alloc  allocates and touches TEST_ALLOC_MB (default 60) MB, writes alloc-<n> into TEST_INSIDE_DIR
                 once it holds it, then frees it (the worker's peak RSS is what its profile learns)
admission.ballast  allocates TEST_BALLAST_MB (default 50) MB and keeps it for the process's life: a worker
                 that has grown during its run
admission.sleep  sleeps payload["seconds"]
admission.slow   writes slow-<n> into TEST_INSIDE_DIR, then sleeps payload["seconds"]
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import cronbox


def _mark(name: str) -> None:
    Path(os.environ["TEST_INSIDE_DIR"], name).write_text(str(os.getpid()))


@cronbox.job("admission", name="admission.alloc", tries=3, timeout=30)
def alloc(payload, ctx):
    data = bytearray(b"\x01") * (int(os.environ.get("TEST_ALLOC_MB") or 60) * 2 ** 20)  # every page touched
    _mark(f"alloc-{payload['n']}")
    del data


BALLAST = []


@cronbox.job("admission", name="admission.ballast", tries=3, timeout=30)
def ballast(payload, ctx):
    BALLAST.append(bytearray(b"\x01") * (int(os.environ.get("TEST_BALLAST_MB") or 50) * 2 ** 20))


@cronbox.job("admission", name="admission.sleep", tries=3, timeout=30)
def sleep(payload, ctx):
    time.sleep(payload["seconds"])


@cronbox.job("admission", name="admission.slow", tries=3, timeout=30)
def slow(payload, ctx):
    _mark(f"slow-{payload['n']}")
    time.sleep(payload["seconds"])
