"""Schedule: tasks, last run, next due, last error; "run now" asks the next tick to run one."""
from __future__ import annotations

from flask import abort, render_template, request

from cronbox.cron.scheduling import builtin  # noqa: F401  (registers the built-in tasks)
from cronbox.cron.scheduling import once as once_requests
from cronbox.cron.scheduling import schedule as scheduler
from cronbox.outbox.core import clock
from cronbox.web.state import runtime

from .. import bp
from ..guard import act, done, operator_name


@bp.get("/schedule")
def schedule():
    rt = runtime()
    return render_template("cronbox_ops/schedule.html", tasks=scheduler.status(rt), now=clock.utcnow())


@bp.post("/schedule/run")
def schedule_run():
    """Queued as a one-off run (`schedule run NAME`): a web request must not run a ten-minute task."""
    name = request.form.get("task", "")
    if runtime().registry.tasks.get(name) is None:
        abort(400, description="no such task")
    request_row = act("schedule.run", name, lambda s: once_requests.add(s, ["schedule", "run", name],
                                                                        source=f"console:{operator_name()}"))
    return done(f"Task {name} will run at the next tick (one-off run #{request_row.id}).", "ops.once")
