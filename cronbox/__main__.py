"""`python -m cronbox`: the process cron starts (tick, queue work, ...). The interpreter runs with its
defaults (the cyclic collector on, nothing frozen): cronbox tunes no part of the process it runs in."""
import sys

from cronbox.cron.cli import script

sys.exit(script())
