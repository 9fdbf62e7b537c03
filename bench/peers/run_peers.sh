#!/usr/bin/env bash
# Peer job-queue benchmark: enqueue + drain no-op jobs, print a markdown table.
#
#   ./run_peers.sh                                # N=5000, 3 runs, all peers
#   NS="5000 20000" RUNS=3 PEERS="huey_sqlite rq_simple" ./run_peers.sh
#   CRONBOX_TREE=/work/wt/before TREE_LABEL=before PEERS="cronbox huey_mysql" WRITE_DOC=0 ./run_peers.sh
#   PEERS="procrastinate cronbox_pg huey_pg celery_sqla_pg" ./run_peers.sh   # queues on PostgreSQL, body in MariaDB
#
# CRONBOX_TREE: the cronbox tree the cronbox peers import and run (`python -m cronbox`) from, default this
# repository; TREE_LABEL names it in the table (cronbox@before). WRITE_DOC=0 leaves docs/benchmarks.md.
#
# Needs MariaDB on 127.0.0.1:3306 (root, no password, db `test`) and Redis on
# 127.0.0.1:6379 (db 9 is flushed!); for procrastinate, cronbox_pg, huey_pg and celery_sqla_pg, PostgreSQL
# on 127.0.0.1:5432 trusting `postgres` (each peer makes its database, and procrastinate its role, if
# missing).  Results are appended to $OUT (JSON lines).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${VENV:-/tmp/bench-peers-venv}
APP_ROOT=$(cd "$HERE/../.." && pwd)
NS=${NS:-5000}
RUNS=${RUNS:-3}
PEERS=${PEERS:-huey_sqlite huey_mysql celery_sqla rq rq_simple}
OUT=${OUT:-/tmp/bench-peers-results.jsonl}

if [ ! -x "$VENV/bin/python" ]; then
  python3.11 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$HERE/requirements-peers.txt" -r "$APP_ROOT/requirements.txt"
fi
PY=$VENV/bin/python
cd "$HERE"

{
  echo "# $(date -u +%FT%TZ) host: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "# python $($PY -c 'import sys;print(sys.version.split()[0])'), sqlite $($PY -c 'import sqlite3;print(sqlite3.sqlite_version)')"
  echo "# mariadb $(mysql -h127.0.0.1 -uroot -N -e 'select concat(version(), " flush_log_at_trx_commit=", @@innodb_flush_log_at_trx_commit)')"
  echo "# redis $(redis-cli -h 127.0.0.1 info server | tr -d '\r' | awk -F: '/redis_version/{print $2}')"
  echo "# postgres $(psql --version 2>/dev/null | awk "{print \$3}") (procrastinate, cronbox_pg, huey_pg and celery_sqla_pg peers)"
  echo "# packages $("$VENV/bin/pip" freeze | grep -iE '^(huey|peewee|pymysql|celery|kombu|sqlalchemy|rq|redis|procrastinate|psycopg)==' | tr '\n' ' ')"
} | tee -a "$OUT"

for n in $NS; do
  $PY baseline.py "$n" | tee -a "$OUT"
  for peer in $PEERS; do
    mod=$peer suffix=
    if [ "$peer" = rq_simple ]; then mod=rq suffix=_simple; fi
    case $peer in cronbox*) if [ -n "${TREE_LABEL:-}" ]; then suffix="@$TREE_LABEL"; fi ;; esac
    for w in 1 2; do
      for r in $(seq "$RUNS"); do
        BENCH_LABEL_SUFFIX=$suffix timeout 1800 $PY bench.py "$mod" "$n" "$w" | tee -a "$OUT" \
          || echo "{\"peer\": \"$peer\", \"n\": $n, \"workers\": $w, \"failed\": true}" | tee -a "$OUT"
      done
    done
  done
done

$PY report.py "$OUT"
if [ "${WRITE_DOC:-1}" = 1 ]; then PYTHONPATH="$APP_ROOT" $PY "$HERE/write_report.py" "$OUT"; fi  # the "Peer job queues" section of docs/benchmarks.md
