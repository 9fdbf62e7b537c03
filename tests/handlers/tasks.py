"""A scheduled task for the race test: appends "<pid>" to TEST_TASK_FILE each time it runs."""
import os

from cronbox.cron.scheduling import schedule


@schedule.every(minutes=5, name="tests.race")
def race(ctx):
    with open(os.environ["TEST_TASK_FILE"], "a") as out:
        out.write(f"{os.getpid()}\n")
