"""`storage ...`: put, grant, revoke, url, verify, rewrap, seal-payloads, audit, sweep, keys, new-key."""
from __future__ import annotations

import mimetypes
import sys
from pathlib import Path

import click
from sqlalchemy import func, select

from cronbox.cron.commands.base import CommandFailed, CommandGroup, runtime
from cronbox.cron.format import DURATION, Checked, Duration, table
from cronbox.outbox.core.errors import UnknownIds
from cronbox.outbox.core.transactions import in_transaction
from cronbox import storage as sealed_storage
from cronbox.storage import audit as file_audit
from cronbox.storage import keys as file_keys
from cronbox.storage import maintenance
from cronbox.storage.display import shown
from cronbox.storage.models import SealedFile
from cronbox.storage.service import Storage
from cronbox.storage.vault import valid_id

FILE_ID = Checked(valid_id, "a file id (32 hex digits)", "file_id")

storage = CommandGroup("storage",
                       help="Sealed files (PHI): seal, grant, sign links, verify, rewrap keys, audit, sweep.")


def _storage() -> Storage:
    """The command's store: the host app's under CRONBOX_APP or `flask --app` (its context is pushed
    for the command), else the standalone one on the command's runtime."""
    runtime()
    return sealed_storage.current()


@storage.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--owner", required=True, help="Opaque owner reference, e.g. patient:1842 (never a name).")
@click.option("--name", default=None, help="Original file name to keep (sealed); default: PATH's name.")
@click.option("--type", "type_", default=None, help="Content type; default: guessed from the name.")
def put(path, owner, name, type_):
    """Seal a file into private storage; prints the new file id. PATH - reads standard input."""
    st = _storage()
    name = name if name is not None else ("upload" if path == "-" else Path(path).name)
    type_ = type_ or mimetypes.guess_type(name)[0] or "application/octet-stream"
    with (open(sys.stdin.fileno(), "rb", buffering=0, closefd=False) if path == "-"
          else open(path, "rb", buffering=0)) as stream:
        sealed = st.seal(stream, filename=name, content_type=type_)
    try:
        file_id = in_transaction(st.sessions, lambda s: st.add(s, sealed, owner=owner))
    except BaseException:
        st.discard(sealed)
        raise
    click.echo(file_id)


@storage.command()
@click.argument("file_id")
@click.option("--subject", required=True, help="Who may download (opaque reference, e.g. user:17).")
@click.option("--expires-in", type=DURATION, default="1h", show_default=True, help="How long the grant lasts.")
@click.option("--max-uses", type=click.IntRange(min=1), default=None, help="Downloads allowed (default: unlimited).")
def grant(file_id, subject, expires_in, max_uses):
    """Allow SUBJECT to download FILE_ID; prints the grant id (for `storage url`)."""
    st = _storage()
    click.echo(in_transaction(st.sessions, lambda s: st.grant(s, file_id, subject, expires_in=expires_in,
                                                              max_uses=max_uses)))


@storage.command()
@click.argument("grant_id")
def revoke(grant_id):
    """Revoke a grant: its links stop working at once."""
    st = _storage()
    changed = in_transaction(st.sessions, lambda s: st.revoke(s, grant_id))
    click.echo(f"revoke: grant {grant_id} {'revoked' if changed else 'was already revoked'}")


@storage.command()
@click.argument("grant_id")
@click.option("--ttl", type=DURATION, default="5m", show_default=True, help="How long the link works.")
@click.option("--absolute", is_flag=True, help="Prefix CRONBOX_BASE_URL: a link for an e-mail or SMS.")
def url(grant_id, ttl, absolute):
    """Print a signed download link (/files/<token>, or with --absolute CRONBOX_BASE_URL/files/<token>)."""
    st = _storage()
    if not 1 <= ttl <= st.settings.url_max_ttl:
        raise click.BadParameter(f"must be 1s to {st.settings.url_max_ttl}s (CRONBOX_URL_MAX_TTL)", param_hint="--ttl")
    click.echo(st.signed_url(grant_id, int(ttl), absolute=absolute))


@storage.command()
@click.argument("file_id", required=False, type=FILE_ID)
@click.option("--all", "all_", is_flag=True, help="Check every file.")
def verify(file_id, all_):
    """Authenticate every chunk of a file (or --all); without either, list recorded integrity errors."""
    if file_id and all_:
        raise click.UsageError("give a file id or --all (not both)")
    st = _storage()
    if not file_id and not all_:
        rows = maintenance.recorded_errors(st)
        if not rows:
            click.echo("no integrity errors recorded (run `storage verify --all` to check every file now)")
            return
        click.echo(table(["file", "checked", "error"], [[r.id, r.checked_at, r.integrity_error] for r in rows]))
        raise CommandFailed(f"{len(rows)} file(s) have integrity errors")
    checked = 0

    def report(checked_id, error):
        nonlocal checked
        checked += 1
        click.echo(f"ok  {checked_id}" if error is None else f"BAD {checked_id}: {error}")

    failures, unknown = maintenance.verify(st, [file_id] if file_id else None, report=report)
    click.echo(f"verify: {checked} checked, {failures} failed")
    if unknown:
        raise UnknownIds("file", unknown)
    if failures:
        raise CommandFailed(f"{failures} file(s) failed verification (listed above)")


@storage.command()
@click.option("--batch-size", type=click.IntRange(min=1, max=5000), default=maintenance.BATCH, show_default=True,
              help="Rows read and re-wrapped per batch (the run checks its lock between batches).")
def rewrap(batch_size):
    """Re-wrap every data key, and re-seal every waiting sealed payload, under the active master key
    (resumable; no file is rewritten); a unique job's default key is re-keyed with its payload."""
    from cronbox.outbox.queue.job_family import idempotency_ttl
    from cronbox.storage import payload_maintenance

    rt = runtime()
    st = _storage()
    lock = rt.lock("rewrap")
    if not lock.acquire():
        click.echo("skipped: storage rewrap already running")
        return
    try:
        active = st.keyring().active.id
        result = maintenance.rewrap(
            st, batch_size=batch_size, before_batch=lock.check,
            progress=lambda r: click.echo(f"rewrap: {r.rewrapped}/{r.total} data keys under {active}"
                                          + (f", {len(r.failed)} failed" if r.failed else "")))
        sealer = rt.sealer()
        payloads = payload_maintenance.ResealResult() if sealer is None else payload_maintenance.rewrap(
            rt.sessions, sealer, batch_size=batch_size, before_batch=lock.check,
            progress=lambda r: click.echo(f"rewrap: {r.done} sealed payloads re-sealed under {active}"),
            key_ttl=idempotency_ttl(rt.settings))
    finally:
        lock.release()
    click.echo(f"rewrap: done, {result.rewrapped} re-wrapped under {active}, {len(result.failed)} failed; "
               f"{payloads.done} sealed payloads re-sealed, {len(payloads.failed)} failed; {_keys_line(payloads)}")
    _duplicates(payloads)
    failed = result.failed + payloads.failed
    for failed_id, reason in failed:
        click.echo(f"  {failed_id}: {reason}")
    if failed:
        raise CommandFailed(f"{len(failed)} data key(s) or payload(s) could not be re-wrapped (listed above)")


@storage.command(name="seal-payloads")
@click.option("--all", "all_", is_flag=True,
              help="Every waiting plaintext payload, not only those of jobs and event types declared sealed.")
@click.option("--batch-size", type=click.IntRange(min=1, max=5000), default=maintenance.BATCH, show_default=True,
              help="Rows read and sealed per batch (the run checks its lock between batches).")
def seal_payloads(all_, batch_size):
    """Seal in place the plaintext payloads of waiting, failed and dead jobs and events written before
    they were declared sealed (resumable); a unique job's default key is re-keyed with its payload, and a
    job then found waiting twice is failed as DuplicateJob (docs/howto/sealed-payloads.md)."""
    import cronbox.outbox.channels  # noqa: F401  (the channel jobs, sealed by default: theirs too)
    from cronbox.outbox.engine.registry import DEFAULT
    from cronbox.outbox.queue.job_family import idempotency_ttl
    from cronbox.storage import payload_maintenance

    rt = runtime()
    sealer = rt.sealer()
    if sealer is None:
        raise CommandFailed("no key vault is configured for this app: nothing can be sealed")
    jobs = None if all_ else {handler.name for handler in rt.jobs.all() if handler.sealed}
    types = None if all_ else set(DEFAULT.sealed_types) | set(rt.registry.sealed_types)
    lock = rt.lock("rewrap")
    if not lock.acquire():
        click.echo("skipped: storage rewrap already running")
        return
    try:
        result = payload_maintenance.seal_plaintext(rt.sessions, sealer, jobs=jobs, event_types=types,
                                                    batch_size=batch_size, before_batch=lock.check,
                                                    key_ttl=idempotency_ttl(rt.settings))
    finally:
        lock.release()
    click.echo(f"seal-payloads: {result.done} payloads sealed, {len(result.failed)} failed; {_keys_line(result)}")
    _duplicates(result)
    for failed_id, reason in result.failed:
        click.echo(f"  {failed_id}: {reason}")
    if result.failed:
        raise CommandFailed(f"{len(result.failed)} payload(s) could not be sealed (listed above)")


def _keys_line(result) -> str:
    """The unique keys part of `rewrap` and `seal-payloads`' last line (payload_maintenance: unique keys)."""
    from cronbox.outbox.queue.jobstore import DUPLICATE_CLASS

    return f"{result.rekeyed} unique keys re-keyed, {result.stopped} duplicate jobs failed as {DUPLICATE_CLASS}"


def _duplicates(result) -> None:
    """One line per duplicate job found: failed (its id, and `queue retry` to run it anyway), or both run."""
    for job_id, what in result.duplicates:
        click.echo(f"  {job_id}: {what}")


@storage.command(name="audit")
@click.option("--file", "file_id", type=FILE_ID, default=None, help="Only entries of this file.")
@click.option("--limit", type=click.IntRange(min=1, max=10000), default=50, show_default=True,
              help="Show at most this many entries, latest first.")
def audit_(file_id, limit):
    """Show the latest audit entries (uploads, grants, links issued, downloads and refusals)."""
    st = _storage()
    rows = in_transaction(st.sessions, lambda s: file_audit.page(s, file_id=file_id, size=limit)).rows
    if not rows:
        click.echo("no audit entries")
        return
    click.echo(table(
        ["at (UTC)", "action", "outcome", "status", "file", "grant", "subject", "range", "bytes", "client"],
        [[r.at.strftime("%Y-%m-%d %H:%M:%S"), r.action, r.outcome, r.status, r.file_id, r.grant_id, shown(r.subject),
          f"{r.range_start}-{r.range_end}" if r.range_start is not None else None, r.bytes_sent, r.client_ip]
         for r in rows]))


@storage.command()
@click.option("--grace", type=Duration(maintenance.MIN_GRACE, f"{maintenance.MIN_GRACE // 3600}h: a younger file may "
                                       "belong to an upload whose transaction has not committed yet"),
              default="24h", show_default=True,
              help="Leave sealed and temporary files younger than this alone (at least 1h: an upload's row "
                   "commits after its file is written, within the web server's request timeout).")
def sweep(grace):
    """Remove orphaned sealed files, stale temporary files, ended grants and audit entries past retention."""
    st = _storage()
    result = maintenance.sweep(st, grace=grace)
    click.echo(f"sweep: {result.orphans} orphaned and {result.temporary} temporary files removed, "
               f"{result.grants} ended grants and {result.audit} audit entries past retention deleted, "
               f"{result.refusals} counts of unrecorded refusals written")


@storage.command()
def keys():
    """List key ids (never key material): which master key is active, how many files each wraps."""
    st = _storage()
    ring = st.keyring()
    counts = dict(in_transaction(st.sessions, lambda s: s.execute(
        select(SealedFile.key_id, func.count()).group_by(SealedFile.key_id)).all()))
    rows = [[key.id, "encryption", "active" if key.id == ring.active.id else "", counts.pop(key.id, 0)]
            for key in sorted(ring.encryption.values(), key=lambda k: k.sequence)]
    rows += [[key.id, "signing", "signs" if key is ring.signing[-1] else "verifies", "-"] for key in ring.signing]
    rows += [[key_id, "MISSING", "", count] for key_id, count in counts.items()]
    click.echo(f"key folder: {ring.folder}")
    click.echo(table(["key id", "kind", "role", "files"], rows))


@storage.command(name="new-key")
@click.option("--signing", is_flag=True, help="Make a URL-signing key instead of a master key.")
def new_key(signing):
    """Add a key: a new active master key (then run `storage rewrap`), or a new signing key."""
    st = _storage()
    key_id = file_keys.new_key(st.settings, file_keys.SIGNING if signing else file_keys.ENCRYPTION)
    click.echo(f"new-key: {key_id}")
    if not signing:
        click.echo("new files are sealed under it now; run `storage rewrap` to move existing data keys to it, "
                   "and keep the old key files until rewrap reports 0 failed")
    else:
        click.echo(f"links are signed with it now; older signing keys verify links for up to "
                   f"{st.settings.url_max_ttl}s more, then may be removed")
