"""Sealed-storage throughput and memory: seal/open file to file, downloads through Flask vs send_file.

    .venv/bin/python bench/bench_storage.py                 # 1 MiB, 64 MiB, 1 GiB; writes docs/benchmarks.md
    .venv/bin/python bench/bench_storage.py --sizes 1M,64M --no-write

MB/s are 10^6 bytes per second of plaintext (as `openssl speed` counts). Every
case runs in its own process so its peak RSS (ru_maxrss / VmHWM) is its own.
Files live in a temporary folder on the same disk as the repository; the
*fsync* cases include the fsync that production does. The ceilings printed
first are the AEAD calls alone on 64 KiB chunks, for "how close does the file
path get".

Every timed file case starts from the same state (see `prepared`): the disk
synced, no dirty pages left to flush, and its output written as a new file
into page-cache memory the previous output just gave back. Cases are
interleaved round by round (the order rotating), after one untimed round.
Without this, 1 GiB numbers measured the machine rather than the code:
ext4 starts writing back a whole file when a truncated file is closed
(`auto_da_alloc`), the 1 GiB of dirty pages left by one case was written
back during the next, and on this VM page cache grown into memory untouched
since boot cost about 2 s of system time per GiB (1 GiB written at 200 to 300
MB/s, against 750 to 2,900 MB/s into memory a deleted file gave back) and fell
on whichever case grew it: the first AES seal, not the XChaCha ones, which
came after the AES files were deleted and reused their memory. And the AEAD ceilings are timed in the rounds
too: the load of this shared machine changes within a run.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import http.client
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.report import replace_section  # noqa: E402

MiB = 1024 * 1024
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Sealed storage"


def parse_size(text: str) -> int:
    units = {"K": 1024, "M": MiB, "G": 1024 * MiB}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def label(size: int) -> str:
    return f"{size // (1024 * MiB)} GiB" if size >= 1024 * MiB else f"{size // MiB} MiB"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_now_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


def measured(work) -> dict:
    """Run `work()` (returns bytes processed): MB/s, peak RSS, and how much the work itself added to it.

    `cpu_mbps` divides by the process's CPU time (user + system) instead of the wall clock: on
    this shared 2-core machine a case waits for a core for a varying share of its run, and the
    CPU time leaves that wait out.
    """
    base = rss_now_mb()
    started, cpu_started = time.perf_counter(), time.process_time()
    size = work()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {"mbps": size / elapsed / 1e6, "cpu_mbps": size / cpu / 1e6, "peak_rss_mb": peak_rss_mb(),
            "growth_mb": max(0.0, peak_rss_mb() - base)}


def make_plaintext(path: Path, size: int) -> None:
    block = os.urandom(MiB)
    with open(path, "wb") as out:
        for start in range(0, size, MiB):
            out.write(block[: min(MiB, size - start)])


# --- cases, each run in a child process ------------------------------------------------------------

def case_ceiling() -> dict:
    """The AEAD calls alone on 64 KiB chunks: PyNaCl's AES-GCM binding (libsodium) and `cronbox.storage.ciphers`'
    (OpenSSL's AES-GCM through `cryptography`, libsodium's XChaCha20-Poly1305 through PyNaCl)."""
    import nacl.bindings as b

    from cronbox.storage.ciphers import AES_256_GCM, XCHACHA20_POLY1305, ChunkCipher

    key, nonce, ad, chunk = os.urandom(32), os.urandom(12), os.urandom(45), os.urandom(64 * 1024)
    rounds = 4000
    started = time.perf_counter()
    for _ in range(rounds):
        b.crypto_aead_aes256gcm_encrypt(chunk, ad, nonce, key)
    public = rounds * len(chunk) / (time.perf_counter() - started) / 1e6
    results = {"pynacl_public_aes": public}
    for name, algorithm, nonce_size in (("cipher_aes", AES_256_GCM, 12), ("cipher_xchacha", XCHACHA20_POLY1305, 24)):
        cipher = ChunkCipher(algorithm, key)
        n = os.urandom(nonce_size)
        count = rounds if algorithm == AES_256_GCM else rounds // 3
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(count):
            cipher.seal(n, chunk, ad)
        results[name] = count * len(chunk) / (time.perf_counter() - started) / 1e6
        results[name + "_cpu"] = count * len(chunk) / (time.process_time() - cpu_started) / 1e6
    return results


def case_aead(algorithm: str, size: str) -> dict:
    """The AEAD alone (`cronbox.storage.ciphers`) on as many 64 KiB chunks as the file has (at least 64 MiB' worth).

    Timed in the same rounds as the copy and the seal, so the bound is made of rates measured
    under the same load as the seal it is compared with.
    """
    from cronbox.storage import ciphers

    code = ciphers.CODES[algorithm]
    cipher = ciphers.ChunkCipher(code, os.urandom(32))
    nonce, ad, chunk = os.urandom(ciphers.NONCE_SIZES[code]), os.urandom(45), os.urandom(64 * 1024)

    def work() -> int:
        count = max(int(size), 64 * MiB) // len(chunk)
        for _ in range(count):
            cipher.seal(nonce, chunk, ad)
        return count * len(chunk)

    return measured(work)


def _write_all(sink, view) -> None:
    while view:
        view = view[sink.write(view):]


def case_seal(src: str, dst: str, algorithm: str, sync: str) -> dict:
    """Sealer.fill_from: plaintext file -> sealed file, straight into the chunk buffers."""
    from cronbox.storage import ciphers
    from cronbox.storage.format import Sealer

    file_id, data_key = bytes.fromhex(Path(dst).stem), bytes.fromhex(Path(dst).suffix[1:])

    def work() -> int:
        with open(src, "rb", buffering=0) as source, open(dst, "wb", buffering=0) as sink:
            sealer = Sealer(sink, file_id=file_id, data_key=data_key, algorithm=ciphers.CODES[algorithm])
            sealer.fill_from(source)
            size = sealer.finish()
            if sync == "fsync":
                os.fsync(sink.fileno())
        return size

    return measured(work)


def case_open(src: str, dst: str, sync: str) -> dict:
    """SealedReader: sealed file -> plaintext file, each chunk authenticated, written chunk by chunk."""
    from cronbox.storage.format import SealedReader

    file_id, data_key = bytes.fromhex(Path(src).stem), bytes.fromhex(Path(src).suffix[1:])

    def work() -> int:
        with open(src, "rb", buffering=0) as source, open(dst, "wb", buffering=0) as sink:
            reader = SealedReader(source, file_id=file_id, data_key=data_key)
            reader.authenticate_end()
            for part in reader:
                _write_all(sink, part)
            if sync == "fsync":
                os.fsync(sink.fileno())
            return reader.size

    return measured(work)


def case_copy(src: str, dst: str, sync: str) -> dict:
    """The same reads and writes with no cryptography: the disk's share of the file path."""
    buffer = memoryview(bytearray(64 * 1024))

    def work() -> int:
        size = 0
        with open(src, "rb", buffering=0) as source, open(dst, "wb", buffering=0) as sink:
            while count := source.readinto(buffer):
                _write_all(sink, buffer[:count])
                size += count
            if sync == "fsync":
                os.fsync(sink.fileno())
        return size

    return measured(work)


def case_serve(instance: str, plaintext: str) -> None:
    """A server process: the app (with /files) plus /plain serving the plaintext with send_file."""
    from flask import send_file
    from werkzeug.serving import make_server

    from app import create_app
    from cronbox.outbox.core.settings import load_settings

    app = create_app(load_settings(environ={"CRONBOX_INSTANCE": instance, "PATH": os.environ.get("PATH", "")}))
    app.add_url_rule("/plain", "plain", lambda: send_file(plaintext, mimetype="application/octet-stream"))
    server = make_server("127.0.0.1", 0, app, threaded=False)
    print(server.server_port, flush=True)
    server.serve_forever()


def case_prepare(instance: str, plaintext: str) -> dict:
    """Seal the plaintext into the instance and return a signed link to it."""
    from cronbox.outbox.core.migrate import upgrade
    from cronbox.outbox.core.settings import load_settings
    from cronbox.outbox.engine.runtime import Runtime
    from cronbox import storage

    settings = load_settings(environ={"CRONBOX_INSTANCE": instance})
    runtime = Runtime(settings)
    upgrade(settings, runtime.engine)
    store = storage.configure(settings, runtime.sessions)
    with runtime.sessions.begin() as session, open(plaintext, "rb", buffering=0) as stream:
        file_id = store.put(session, stream, filename="bench.bin", content_type="application/octet-stream",
                            owner="bench")
        grant_id = store.grant(session, file_id, "bench", expires_in=86400)
    return {"url": store.signed_url(grant_id, 3600)}


# --- the driver ----------------------------------------------------------------------------------

REPEAT = 5
SETTLE = 0.5  # seconds after the sync, for the flusher and the journal to go quiet


def child(*args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--case", *args], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_of(runs: list[dict]) -> dict:
    """The run with the median throughput, and the spread of all runs (this 2-core machine is shared)."""
    middle = sorted(runs, key=lambda run: run["mbps"])[len(runs) // 2]
    result = {**middle, "runs": [run["mbps"] for run in runs]}
    if all("cpu_mbps" in run for run in runs):
        result["cpu_mbps"] = sorted(run["cpu_mbps"] for run in runs)[len(runs) // 2]
    return result


def prepared(output: Path) -> None:
    """Put the machine in the same state before every timed case: fair to all of them.

    Sync first, so no case pays for writing back the dirty pages of the ones before it
    (with 1 GiB files that flush otherwise ran during the next case, on one of 2 cores).
    Then remove the case's output, so it is written as a new file, as production writes
    one: truncating and rewriting a file makes ext4 start writing it back on close
    (`auto_da_alloc`), inside the timing. Removing it after the sync gives its clean
    pages back to the allocator, and the new output reuses that memory rather than
    growing the page cache into memory not touched since the VM booted (~2 s a GiB here).
    """
    os.sync()
    time.sleep(SETTLE)
    output.unlink(missing_ok=True)


def download(port: int, path: str) -> tuple[int, float, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    connection.request("GET", path)
    response = connection.getresponse()
    assert response.status == 200, response.status
    digest, total = hashlib.sha256(), 0
    while chunk := response.read(MiB):
        total += len(chunk)
        digest.update(chunk)
    elapsed = time.perf_counter() - started
    connection.close()
    return total, total / elapsed / 1e6, digest.hexdigest()


def warm_up(port: int, path: str) -> None:
    """A HEAD first (no use counted): the schema check, key loading and imports of a first request are not timed."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("HEAD", path)
    connection.getresponse().read()
    connection.close()


def vm_hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def openssl_speed() -> float | None:
    if not shutil.which("openssl"):
        return None
    proc = subprocess.run(["openssl", "speed", "-evp", "aes-256-gcm", "-bytes", "16384", "-seconds", "2"],
                          capture_output=True, text=True)
    match = re.search(r"^(?:AES-256-GCM|aes-256-gcm)\s+([\d.]+)k", proc.stdout, re.M | re.I)
    return float(match.group(1)) / 1000 if match else None


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(MiB):
            digest.update(block)
    return digest.hexdigest()


def file_cases(plain: Path, scratch: Path, size: int, sync: str) -> list[dict]:
    """Copy, seal and open `plain` in interleaved rounds; one row per algorithm, medians of REPEAT rounds."""
    copy_path, opened_path = scratch / "copy.bin", scratch / "opened.bin"
    sealed = {algorithm: scratch / (os.urandom(16).hex() + "." + os.urandom(32).hex())
              for algorithm in ("aes-256-gcm", "xchacha20-poly1305")}
    cases = [("copy", copy_path, ("copy", str(plain), str(copy_path), sync))]
    for algorithm, path in sealed.items():
        cases.append((("aead", algorithm), None, ("aead", algorithm, str(size))))
        cases.append((("seal", algorithm), path, ("seal", str(plain), str(path), algorithm, sync)))
        cases.append((("open", algorithm), opened_path, ("open", str(path), str(opened_path), sync)))
    runs: dict = {key: [] for key, _, _ in cases}
    expected = file_digest(plain)
    for round_ in range(REPEAT + 1):  # round 0 is untimed: it makes the files and grows the page cache
        turn = round_ % len(cases)
        for key, output, args in cases[turn:] + cases[:turn]:
            if output is not None:
                prepared(output)
            result = child(*args)
            if round_:
                runs[key].append(result)
            if key[0] == "open":
                assert file_digest(opened_path) == expected
    rows = []
    copy = median_of(runs["copy"])
    for algorithm in sealed:
        seal, opened = median_of(runs[("seal", algorithm)]), median_of(runs[("open", algorithm)])
        rows.append({"size": size, "algorithm": algorithm, "sync": sync, "seal": seal, "open": opened, "copy": copy,
                     "aead": median_of(runs[("aead", algorithm)])})
        print(f"{label(size):>7} {algorithm:<19} {sync:<5} seal {seal['mbps']:6.0f} MB/s {spread(seal)}  "
              f"open {opened['mbps']:6.0f} MB/s {spread(opened)}  plain copy {copy['mbps']:6.0f} MB/s {spread(copy)}  "
              f"RSS seal {seal['peak_rss_mb']:.0f} MB (+{seal['growth_mb']:.1f}) "
              f"open {opened['peak_rss_mb']:.0f} MB (+{opened['growth_mb']:.1f})", flush=True)
    for path in (copy_path, opened_path, *sealed.values()):
        path.unlink(missing_ok=True)
    return rows


def spread(result: dict) -> str:
    """The lowest and highest of a case's runs, e.g. "(1,020-1,310)"."""
    return f"({min(result['runs']):,.0f}-{max(result['runs']):,.0f})"


def run(sizes: list[int], download_sizes: list[int]) -> dict:
    ceilings = [child("ceiling") for _ in range(REPEAT)]
    results: dict = {"ceiling": {key: sorted(run[key] for run in ceilings)[REPEAT // 2] for key in ceilings[0]},
                     "openssl_16k": openssl_speed(), "files": [], "downloads": []}
    print("ceilings (MB/s):", {key: round(value) for key, value in results["ceiling"].items()},
          "openssl 16 KiB:", results["openssl_16k"], flush=True)
    with tempfile.TemporaryDirectory(dir=ROOT / "bench") as scratch:
        scratch = Path(scratch)
        for size in sizes:
            plain = scratch / "plain.bin"
            make_plaintext(plain, size)
            for sync in ("cache", "fsync"):
                results["files"] += file_cases(plain, scratch, size, sync)
        for size in download_sizes:
            plain = scratch / "plain.bin"
            make_plaintext(plain, size)
            expected = file_digest(plain)
            instance = scratch / f"instance-{size}"
            url = child("prepare", str(instance), str(plain))["url"]
            for name, path in (("flask /files (sealed)", url), ("werkzeug send_file (plaintext)", "/plain")):
                runs = []
                for _ in range(REPEAT):
                    os.sync()  # the sealing just above left its file dirty
                    time.sleep(SETTLE)
                    server = subprocess.Popen([sys.executable, __file__, "--case", "serve", str(instance), str(plain)],
                                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
                    try:
                        port = int(server.stdout.readline())
                        warm_up(port, path)
                        total, mbps, digest = download(port, path)
                        rss = vm_hwm_mb(server.pid)
                    finally:
                        server.terminate()
                        server.wait(timeout=30)
                    assert total == size and digest == expected
                    runs.append({"mbps": mbps, "server_peak_rss_mb": rss})
                run_ = median_of(runs)
                results["downloads"].append({"size": size, "what": name, **run_})
                print(f"{label(size):>7} {name:<31} {run_['mbps']:7.0f} MB/s   server peak RSS "
                      f"{run_['server_peak_rss_mb']:.0f} MB", flush=True)
            shutil.rmtree(instance)
    return results


def markdown(results: dict, command: str) -> str:
    today = datetime.date.today().isoformat()
    ceiling = results["ceiling"]
    lines = [SECTION, "",
             f"Measured {today} on this machine (2 cores, shared with other work) with `{command}`: "
             f"the median of {REPEAT} runs per case (lowest-highest in brackets), each in its own process (peak "
             "RSS is that process's, imports included). MB = 10^6 bytes of plaintext per second.",
             "", "AEAD calls alone, 64 KiB chunks (the ceilings, measured once before the rest):", "",
             "| call | MB/s |", "|---|---|"]
    if results["openssl_16k"]:
        lines.append(f"| `openssl speed -evp aes-256-gcm -bytes 16384` | {results['openssl_16k']:,.0f} |")
    lines += [f"| PyNaCl `crypto_aead_aes256gcm_encrypt` (libsodium) | {ceiling['pynacl_public_aes']:,.0f} |",
              f"| OpenSSL AES-256-GCM through `cryptography` (`cronbox.storage.ciphers`) | {ceiling['cipher_aes']:,.0f} |",
              f"| libsodium XChaCha20-Poly1305 through PyNaCl (`cronbox.storage.ciphers`) | {ceiling['cipher_xchacha']:,.0f} |",
              "", "File to file: `Sealer.fill_from` (plaintext file to sealed file) and `SealedReader` (sealed "
              "file to plaintext file, every chunk authenticated), against a plain 64 KiB copy of the same file. "
              "*cache*: the writes stay in the page cache; *fsync*: the file is made durable, as production does. "
              f"The cases run in {REPEAT} interleaved rounds (order rotating) after an untimed one; before each, the "
              "disk is synced and the case's output removed, so every case writes a new file, with nothing of the "
              "cases before it left to flush, into page-cache memory the previous output just gave back "
              "(the script's docstring says what each of these removed from the 1 GiB numbers).",
              "",
              "The *bound* is what doing that same copy and the AEAD one after the other would reach, "
              "1 / (1/copy + 1/AEAD): a process on a shared host gets no second core to overlap them "
              "(Passenger forbids background threads). Its *AEAD* is `cronbox.storage.ciphers`' call on as many chunks as "
              "the file has (at least 64 MiB' worth), timed in the same rounds as the copy and the seal "
              "(the machine's load changes within a run: a ceiling timed once, on a quiet minute, made a bound "
              "no seal timed on a loaded one could meet). "
              "*By CPU time* is the same ratio with every rate taken over the process's CPU time (user + system) "
              "instead of the wall clock: on this shared machine a case also waits for a core, for a share of "
              "its run that changes from run to run.",
              "", "| size | algorithm | writes | seal MB/s | open MB/s | plain copy MB/s | AEAD MB/s | bound MB/s "
              "| seal / open % of bound | by CPU time | peak RSS seal / open (added by the work) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in results["files"]:
        bound, cpu = bounds(row, ceiling)
        aead = cell(row["aead"]) if "aead" in row else f"{aead_rate(row, ceiling, 'mbps'):,.0f}"
        by_cpu = (f"{100 * row['seal']['cpu_mbps'] / cpu:.0f}% / {100 * row['open']['cpu_mbps'] / cpu:.0f}%"
                  if cpu else "-")
        lines.append(f"| {label(row['size'])} | {row['algorithm']} | {row['sync']} | {cell(row['seal'])} | "
                     f"{cell(row['open'])} | {cell(row['copy'])} | {aead} | {bound:,.0f} | "
                     f"{100 * row['seal']['mbps'] / bound:.0f}% / {100 * row['open']['mbps'] / bound:.0f}% | "
                     f"{by_cpu} | {row['seal']['peak_rss_mb']:.0f} (+{row['seal']['growth_mb']:.1f}) / "
                     f"{row['open']['peak_rss_mb']:.0f} (+{row['open']['growth_mb']:.1f}) MB |")
    lines += ["", "Downloads over loopback HTTP (Werkzeug's server, one request, client reads 1 MiB at a time; "
              "`/files` includes the token, grant and use-count checks, `send_file` reads 8 KiB at a time here "
              "as Werkzeug's server offers no `wsgi.file_wrapper`):", "",
              "| size | served by | MB/s | server peak RSS |", "|---|---|---|---|"]
    for row in results["downloads"]:
        lines.append(f"| {label(row['size'])} | {row['what']} | {row['mbps']:,.0f} | {row['server_peak_rss_mb']:.0f} MB |")
    lines += ["", summary(results)]
    return "\n".join(lines) + "\n"


def cell(result: dict) -> str:
    """The median and, where the runs were kept, their spread."""
    return f"{result['mbps']:,.0f} {spread(result)}" if "runs" in result else f"{result['mbps']:,.0f}"


def aead_rate(row: dict, ceiling: dict, key: str) -> float | None:
    """The row's AEAD rate (`mbps` or `cpu_mbps`): timed in its rounds, else (older saved results) the ceiling."""
    if "aead" in row:
        return row["aead"].get(key)
    name = "cipher_aes" if row["algorithm"] == "aes-256-gcm" else "cipher_xchacha"
    name += "_cpu" if key == "cpu_mbps" else ""
    return ceiling.get(name)


def bounds(row: dict, ceiling: dict) -> tuple[float, float | None]:
    """1 / (1/copy + 1/AEAD) by the wall clock, and by CPU time (None where that was not measured)."""
    wall = 1 / (1 / row["copy"]["mbps"] + 1 / aead_rate(row, ceiling, "mbps"))
    aead_cpu = aead_rate(row, ceiling, "cpu_mbps")
    if aead_cpu is None or "cpu_mbps" not in row["copy"]:
        return wall, None
    return wall, 1 / (1 / row["copy"]["cpu_mbps"] + 1 / aead_cpu)


def summary(results: dict) -> str:
    """The answer to "how close does the file path get", from the numbers above."""
    rows = [r for r in results["files"] if r["algorithm"] == "aes-256-gcm" and r["sync"] == "cache"]
    if not rows:
        return ""
    shown = [r for r in rows if r["size"] >= 64 * MiB] or [max(rows, key=lambda r: r["size"])]
    ceiling = results["ceiling"]["cipher_aes"]
    parts = []
    for row in shown:
        bound, cpu = bounds(row, results["ceiling"])
        part = (f"{label(row['size'])} at {row['seal']['mbps']:,.0f} MB/s, {100 * row['seal']['mbps'] / bound:.0f}% "
                f"of its {bound:,.0f} MB/s bound")
        if cpu:
            part += f" ({100 * row['seal']['cpu_mbps'] / cpu:.0f}% by CPU time)"
        parts.append(part)
    text = (f"How close: with AES-256-GCM in the page cache, sealing runs {' and '.join(parts)}. "
            f"The AEAD (OpenSSL's AES-256-GCM) runs at {ceiling:,.0f} MB/s on its own, "
            f"{ceiling / results['ceiling']['pynacl_public_aes']:.1f}× PyNaCl's (libsodium's) binding")
    if results["openssl_16k"]:
        text += f" and {100 * ceiling / results['openssl_16k']:.0f}% of `openssl speed`"
    text += (". The rest of the file path's time is the kernel copying the file into and out of the page cache, "
             "which a plain copy pays too; with fsync the disk sets the pace. Memory does not depend on the size.")
    slow = []
    for row in results["files"]:
        cpu = bounds(row, results["ceiling"])[1]
        if row["size"] >= 64 * MiB and cpu and row["seal"]["cpu_mbps"] < 0.7 * cpu:
            slow.append(f"{label(row['size'])} {row['algorithm']} ({row['sync']}, "
                        f"{100 * row['seal']['cpu_mbps'] / cpu:.0f}%)")
    if slow:
        text += (f" Below 70% of the bound even by CPU time: {', '.join(slow)}. The sealer's code is the same "
                 "for every row, so such a row says more about the machine: on this VM the kernel's cost of "
                 "writing into the page cache depends on the memory it is given (growing it into memory untouched "
                 "since boot costs ~2 s a GiB), and a row measured again can move by as much.")
    downloads = {(r["size"], r["what"].split()[0]): r["mbps"] for r in results["downloads"]}
    for size in sorted({size for size, _ in downloads}):
        if (size, "flask") in downloads and (size, "werkzeug") in downloads:
            text += (f" Downloading {label(size)} through `/files` runs at "
                     f"{100 * downloads[(size, 'flask')] / downloads[(size, 'werkzeug')]:.0f}% of `send_file` "
                     "serving the plaintext.")
    return text


def write_section(text: str) -> None:
    replace_section("storage", text)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--case":
        name, args = sys.argv[2], sys.argv[3:]
        if name == "serve":
            case_serve(*args)
            return
        print(json.dumps({"ceiling": case_ceiling, "seal": case_seal, "open": case_open, "copy": case_copy,
                          "aead": case_aead, "prepare": case_prepare}[name](*args)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,64M,1G", help="file-to-file sizes")
    parser.add_argument("--download-sizes", default="64M,1G")
    parser.add_argument("--no-write", action="store_true", help=f"print only; do not update {DOC.name}")
    parser.add_argument("--save-json", help="also write the raw results to this file")
    parser.add_argument("--from-json", help="render docs from results saved by --save-json instead of measuring")
    options = parser.parse_args()
    if options.from_json:
        saved = json.loads(Path(options.from_json).read_text())
        results, command = saved["results"], saved["command"]
    else:
        results = run([parse_size(s) for s in options.sizes.split(",")],
                      [parse_size(s) for s in options.download_sizes.split(",") if s])
        command = f"python bench/bench_storage.py --sizes {options.sizes} --download-sizes {options.download_sizes}"
        if options.save_json:
            Path(options.save_json).write_text(json.dumps({"results": results, "command": command.strip()}))
    if not options.no_write:
        write_section(markdown(results, command.strip()))
        print(f"wrote the '{SECTION[3:]}' section of {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
