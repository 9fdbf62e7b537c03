"""Put report.py's table for a results file into the "Peer job queues" section of docs/benchmarks.md.

    python bench/peers/write_report.py /tmp/bench-peers-results.jsonl
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from bench.report import write_section  # noqa: E402

table = subprocess.run([sys.executable, os.path.join(HERE, "report.py"), sys.argv[1]], capture_output=True,
                       text=True, check=True).stdout
rates = {}
for line in table.splitlines():
    cells = [c.strip() for c in line.strip("|").split("|")]
    if len(cells) > 5 and cells[1].isdigit() and cells[4] and cells[5]:
        rates[(cells[0], cells[1])] = (cells[4].split()[0], cells[5].split()[0])


def ratio(peer: str, other: str, n: str, column: int) -> str:
    try:
        return f"{float(rates[(peer, n)][column].replace(',', '')) / float(rates[(other, n)][column].replace(',', '')):.1f}x"
    except (KeyError, ValueError, ZeroDivisionError):
        return "-"


notes = ["", "Ratios from this run (drain, 1 worker / 2 workers):", ""]
for n in sorted({n for _, n in rates}):
    notes.append(f"- N={n}: cronbox on MariaDB vs huey SqlHuey {ratio('cronbox', 'huey_mysql', n, 0)} / "
                 f"{ratio('cronbox', 'huey_mysql', n, 1)}; vs Celery on kombu's SQL transport "
                 f"{ratio('cronbox', 'celery_sqla', n, 0)} / {ratio('cronbox', 'celery_sqla', n, 1)}; cronbox on "
                 f"SQLite vs SqliteHuey {ratio('cronbox_sqlite', 'huey_sqlite', n, 0)} / "
                 f"{ratio('cronbox_sqlite', 'huey_sqlite', n, 1)}; cronbox on PostgreSQL vs procrastinate "
                 f"{ratio('cronbox_pg', 'procrastinate', n, 0)} / {ratio('cronbox_pg', 'procrastinate', n, 1)}, "
                 f"vs huey SqlHuey there {ratio('cronbox_pg', 'huey_pg', n, 0)} / {ratio('cronbox_pg', 'huey_pg', n, 1)}, "
                 f"vs Celery on kombu's SQL transport there {ratio('cronbox_pg', 'celery_sqla_pg', n, 0)} / "
                 f"{ratio('cronbox_pg', 'celery_sqla_pg', n, 1)}.")
notes.append("")
notes.append("The harness is in `bench/peers/` (`peer_cronbox.py`, `peer_cronbox_sqlite.py` and "
             "`peer_cronbox_pg.py` are cronbox; `peer_huey_pg.py` and `peer_celery_sqla_pg.py` are huey_mysql's and "
             "celery_sqla's peers with their queue on PostgreSQL; bench-only requirements: "
             "`bench/peers/requirements-peers.txt`). "
             "Every peer runs the same job body: one autocommit `UPDATE bench_counter SET n = n + 1` on MariaDB.")
write_section("peers", "Peer job queues", "NS=5000 RUNS=3 bench/peers/run_peers.sh", table + "\n".join(notes))
print("wrote the Peer job queues section")
