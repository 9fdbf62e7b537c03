"""Registries for tests, built through Registry's public calls (add, on_channel_pause).

`copy_of(DEFAULT)` starts from what the imported modules registered without touching the default's
contents; `copy_of(registry, leaving_out={"gone"})` is the registry of a process deployed without
a handler's module (its rows must wait, never die).
"""
from __future__ import annotations

from cronbox.outbox.engine.registry import Registry


def copy_of(registry: Registry, *, leaving_out: frozenset[str] | set[str] = frozenset()) -> Registry:
    """A new registry holding what `registry` holds now, less the consumers, jobs and tasks named in
    `leaving_out`; changes to either stay their own."""
    twin = Registry()
    for source, target in ((registry.consumers, twin.consumers), (registry.jobs, twin.jobs),
                           (registry.tasks, twin.tasks)):
        for item in source.in_order():
            if item.name not in leaving_out:
                target.add(item)
    for listener in registry.pause_listeners:
        twin.on_channel_pause(listener)
    return twin
