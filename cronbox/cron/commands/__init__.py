"""One module per command group, named after it; `cron/cli.py` puts them on the root group."""
