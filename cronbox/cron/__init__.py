"""The cronbox command line: `python -m cronbox COMMAND`, `flask --app app cron COMMAND`, artisan_via_cron.sh."""
