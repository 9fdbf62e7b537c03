"""`python -m cron`, the spelling before 0.7: cronbox's command line is `python -m cronbox` now (or the
`cronbox` script). Run from a checkout, where the folder `cron/` is still importable by that name, this
says so in one line, as a cron mail would show it, instead of running. Nothing is imported from it."""
import sys

sys.stderr.write("error: `python -m cron` is `python -m cronbox` since cronbox 0.7 "
                 "(README, \"Upgrading to 0.7\")\n")
sys.exit(2)
