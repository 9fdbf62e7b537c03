"""cronbox's enqueue against huey's, interleaved call by call in one process (the "Peer enqueue" section).

    VENV=/tmp/bench-peers-venv; $VENV/bin/python bench/peers/enqueue_pair.py mysql|sqlite [N] [ROUNDS]

Each peer's `enqueue_one()` from this folder (cronbox: one `dispatch()` in its own Session
transaction, as a web request would; huey: `task()`, an autocommit INSERT), alternating call by
call (which goes first alternates too) so that the rest of the machine's load falls on both
alike. Separate runs of `bench.py PEER N 1` one after the other scattered from 0.5x to 1.8x on a
loaded machine. Each round enqueues N jobs per peer after emptying both queues; a rate is the
median over the rounds, the ratio the median of the rounds' own ratios. CPU is this process's
(user + system) per enqueue. The queues live in databases/files of their own (removed at the end).
Needs huey and peewee (requirements-peers.txt) besides cronbox's requirements.
"""
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(store: str, n: int, rounds: int) -> None:
    folder = tempfile.mkdtemp(prefix="cronbox-enqueue-pair-")
    os.environ["CRONBOX_PEER_DIR"] = folder
    os.environ["HUEY_SQLITE_FILE"] = os.path.join(folder, "huey.db")
    if store == "mysql":
        database = f"cronbox_enqueue_pair_{os.getpid()}"
        os.environ["DATABASE_URL"] = f"mysql+pymysql://root:@127.0.0.1/{database}"
        import peer_cronbox as cronbox
        import peer_huey_mysql as huey
    else:
        import peer_cronbox_sqlite as cronbox
        import peer_huey_sqlite as huey
    peers = {"cronbox": cronbox, "huey": huey}
    for peer in peers.values():
        peer.reset()
        for _ in range(50):  # warm up: connections, compiled statements
            peer.enqueue_one()
    rates = {name: [] for name in peers}
    cpu = {name: [] for name in peers}
    wall_clock, cpu_clock = time.perf_counter, time.process_time
    for _ in range(rounds):
        for peer in peers.values():
            peer.reset()
        wall = dict.fromkeys(peers, 0.0)
        used = dict.fromkeys(peers, 0.0)
        for i in range(n):
            for name in (("cronbox", "huey") if i % 2 else ("huey", "cronbox")):
                started, started_cpu = wall_clock(), cpu_clock()
                peers[name].enqueue_one()
                wall[name] += wall_clock() - started
                used[name] += cpu_clock() - started_cpu
        for name in peers:
            rates[name].append(n / wall[name])
            cpu[name].append(used[name] / n * 1e6)
    ratios = [c / h for c, h in zip(rates["cronbox"], rates["huey"])]
    for name in peers:
        print(f"{store} {name}: {statistics.median(rates[name]):,.0f} jobs/s, "
              f"{statistics.median(cpu[name]):,.0f} µs CPU a job")
    print(f"{store} cronbox / huey: {statistics.median(ratios):.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
    for peer in peers.values():
        peer.reset()
    if store == "mysql":
        from sqlalchemy import text
        with cronbox.engine().begin() as connection:
            connection.execute(text(f"DROP DATABASE {database}"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 500, int(sys.argv[3]) if len(sys.argv) > 3 else 7)
