"""Importing this package registers every command on cron.cli.cli."""
from cron.commands import demo, migrate, outbox_cmds, storage_cmds, tick  # noqa: F401
