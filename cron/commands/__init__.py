"""Importing this package registers every command on cron.cli.cli (storage_cmds lazily: see cron.cli.Group)."""
from cron.commands import demo, migrate, ops_cmds, outbox as outbox_cmds, queue as queue_cmds, tick  # noqa: F401
