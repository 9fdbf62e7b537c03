"""Importing this package registers every command on cron.cli.cli."""
from cron.commands import demo, migrate, ops_cmds, outbox_cmds, queue_cmds, storage_cmds, tick  # noqa: F401
