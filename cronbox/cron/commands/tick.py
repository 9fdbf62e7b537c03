import click

from cronbox.cron.commands.base import command_runner, runtime
from cronbox.cron.scheduling.tick import DEFAULT_MAX_TIME, DEFAULT_MEMORY_MB, run_tick
from cronbox.outbox.events.forward import is_forward


@click.command()
@click.option("--max-time", type=click.FloatRange(min=1), default=DEFAULT_MAX_TIME, show_default=True,
              help="Stop claiming work so the run ends within this many seconds.")
@click.option("--no-linger", is_flag=True, help="Exit as soon as nothing is due instead of polling until --max-time.")
@click.option("--memory", type=click.FloatRange(min=8), default=DEFAULT_MEMORY_MB, show_default=True,
              help="Stop claiming work when the process's RSS passes this many MB.")
@click.pass_context
def tick(ctx, max_time, no_linger, memory):
    """Run everything due (scheduled tasks, one-off runs, the outbox relay, then queued jobs), then keep polling
    until --max-time. Install this in cron."""
    # The schema is checked under the tick lock, where a `migrate` request file can still fix it.
    rt = runtime(migrate=False)
    report = run_tick(rt, run_command=command_runner(), max_time=max_time,
                      linger=not no_linger, memory_mb=memory)
    click.echo(report.summary())
    if not report.skipped and any(is_forward(c) for c in rt.consumers.all()):
        from cronbox.cron.scheduling.health import forward_warning  # only after the tick's own work, only for forwarders

        warning = forward_warning(rt)
        if warning:
            click.echo(warning, err=True)  # cron mails it, even with stdout sent to /dev/null
    ctx.exit(report.exit_code)
