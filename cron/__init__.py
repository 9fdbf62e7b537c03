"""The cronbox command line: `python -m cron COMMAND`, `flask --app app cron COMMAND`, artisan_via_cron.sh."""
