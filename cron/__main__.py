"""`python -m cron`: the process cron starts (tick, queue work, ...), and nothing else runs in.

Start-up allocates a few hundred thousand long-lived objects (modules, classes, mapped tables,
compiled regexes) and next to no garbage, yet the cyclic collector, triggered by allocation counts,
walks that growing heap again and again while it loads: ~60 ms of a quiet tick's ~0.4 s of CPU on
the bench machine. So it is off while the command tree and the command's own module load; then
what loaded is frozen (moved out of the collector's generations: later collections, during the
command, never walk it again) and collection is back on for the command itself, whose handlers may
well make cycles. This is the
process's own entry point: `flask --app ... cron` and a host app importing cronbox are untouched.
"""
import gc
import sys

gc.disable()
try:
    from cron.cli import import_command, script

    import_command(sys.argv[1:])  # the command's own module (a tick: the stages, the store modules)
finally:
    gc.freeze()
    gc.enable()

sys.exit(script())
