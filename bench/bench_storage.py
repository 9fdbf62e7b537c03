"""Sealed-storage throughput and memory: seal/open file to file, downloads through Flask vs send_file.

    .venv/bin/python bench/bench_storage.py                 # 1 MiB, 64 MiB, 1 GiB; writes docs/benchmarks.md
    .venv/bin/python bench/bench_storage.py --sizes 1M,64M --no-write

MB/s are 10^6 bytes per second of plaintext (as `openssl speed` counts). Every
case runs in its own process so its peak RSS (ru_maxrss / VmHWM) is its own.
Files live in a temporary folder on the same disk as the repository; sealing
includes the fsync and rename that production does. The ceilings printed
first are the AEAD calls alone on 64 KiB chunks, for "how close does the file
path get".
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
    """Run `work()` (returns bytes processed): MB/s, peak RSS, and how much the work itself added to it."""
    base = rss_now_mb()
    started = time.perf_counter()
    size = work()
    elapsed = time.perf_counter() - started
    return {"mbps": size / elapsed / 1e6, "peak_rss_mb": peak_rss_mb(), "growth_mb": max(0.0, peak_rss_mb() - base)}


def make_plaintext(path: Path, size: int) -> None:
    block = os.urandom(MiB)
    with open(path, "wb") as out:
        for start in range(0, size, MiB):
            out.write(block[: min(MiB, size - start)])


# --- cases, each run in a child process ------------------------------------------------------------

def case_ceiling() -> dict:
    """The AEAD calls alone on 64 KiB chunks: PyNaCl's public binding (fresh buffer) and ours (reused)."""
    import nacl.bindings as b

    from storage.ciphers import AES_256_GCM, XCHACHA20_POLY1305, ChunkCipher

    key, nonce, ad, chunk = os.urandom(32), os.urandom(12), os.urandom(45), os.urandom(64 * 1024)
    rounds = 4000
    started = time.perf_counter()
    for _ in range(rounds):
        b.crypto_aead_aes256gcm_encrypt(chunk, ad, nonce, key)
    public = rounds * len(chunk) / (time.perf_counter() - started) / 1e6
    results = {"pynacl_public_aes": public}
    for name, algorithm, nonce_size in (("reused_aes", AES_256_GCM, 12), ("reused_xchacha", XCHACHA20_POLY1305, 24)):
        cipher = ChunkCipher(algorithm, key, len(chunk))
        n = os.urandom(nonce_size)
        count = rounds if algorithm == AES_256_GCM else rounds // 3
        started = time.perf_counter()
        for _ in range(count):
            cipher.seal(n, chunk, ad)
        results[name] = count * len(chunk) / (time.perf_counter() - started) / 1e6
    return results


def _write_all(sink, view) -> None:
    while view:
        view = view[sink.write(view):]


def case_seal(src: str, dst: str, algorithm: str, sync: str) -> dict:
    """Sealer.fill_from: plaintext file -> sealed file, straight into the chunk buffers."""
    from storage import ciphers
    from storage.format import Sealer

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
    """SealedReader: sealed file -> plaintext file, each chunk authenticated, written from the reused buffer."""
    from storage.format import SealedReader

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
    from outbox.core.settings import load_settings

    app = create_app(load_settings(environ={"CRONBOX_INSTANCE": instance, "PATH": os.environ.get("PATH", "")}))
    app.add_url_rule("/plain", "plain", lambda: send_file(plaintext, mimetype="application/octet-stream"))
    server = make_server("127.0.0.1", 0, app, threaded=False)
    print(server.server_port, flush=True)
    server.serve_forever()


def case_prepare(instance: str, plaintext: str) -> dict:
    """Seal the plaintext into the instance and return a signed link to it."""
    from outbox.core.migrate import upgrade
    from outbox.core.settings import load_settings
    from outbox.engine.runtime import Runtime
    import storage

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

REPEAT = 3


def child(*args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--case", *args], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_of(runs: list[dict]) -> dict:
    """The run with the median throughput (this 2-core machine is shared: single runs wobble)."""
    return sorted(runs, key=lambda run: run["mbps"])[len(runs) // 2]


def timed_child(*args: str) -> dict:
    return median_of([child(*args) for _ in range(REPEAT)])


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
                copy = timed_child("copy", str(plain), str(scratch / "copy.bin"), sync)
                for algorithm in ("aes-256-gcm", "xchacha20-poly1305"):
                    sealed = scratch / (os.urandom(16).hex() + "." + os.urandom(32).hex())
                    seal = timed_child("seal", str(plain), str(sealed), algorithm, sync)
                    opened_path = scratch / "opened.bin"
                    opened = timed_child("open", str(sealed), str(opened_path), sync)
                    assert file_digest(opened_path) == file_digest(plain)
                    results["files"].append({"size": size, "algorithm": algorithm, "sync": sync, "seal": seal,
                                             "open": opened, "copy": copy})
                    print(f"{label(size):>7} {algorithm:<19} {sync:<5} seal {seal['mbps']:6.0f} MB/s  "
                          f"open {opened['mbps']:6.0f} MB/s  plain copy {copy['mbps']:6.0f} MB/s  "
                          f"RSS seal {seal['peak_rss_mb']:.0f} MB (+{seal['growth_mb']:.1f}) "
                          f"open {opened['peak_rss_mb']:.0f} MB (+{opened['growth_mb']:.1f})", flush=True)
                    sealed.unlink()
                    opened_path.unlink()
                (scratch / "copy.bin").unlink()
        for size in download_sizes:
            plain = scratch / "plain.bin"
            make_plaintext(plain, size)
            expected = file_digest(plain)
            instance = scratch / f"instance-{size}"
            url = child("prepare", str(instance), str(plain))["url"]
            for name, path in (("flask /files (sealed)", url), ("werkzeug send_file (plaintext)", "/plain")):
                runs = []
                for _ in range(REPEAT):
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
             f"the median of {REPEAT} runs per case, each in its own process (peak RSS is that process's, "
             "imports included). MB = 10^6 bytes of plaintext per second.",
             "", "AEAD calls alone, 64 KiB chunks (the ceilings):", "",
             "| call | MB/s |", "|---|---|"]
    if results["openssl_16k"]:
        lines.append(f"| `openssl speed -evp aes-256-gcm -bytes 16384` | {results['openssl_16k']:,.0f} |")
    lines += [f"| PyNaCl `crypto_aead_aes256gcm_encrypt` (new buffer per call) | {ceiling['pynacl_public_aes']:,.0f} |",
              f"| libsodium AES-256-GCM into a reused buffer (`storage.ciphers`) | {ceiling['reused_aes']:,.0f} |",
              f"| libsodium XChaCha20-Poly1305 into a reused buffer | {ceiling['reused_xchacha']:,.0f} |",
              "", "File to file: `Sealer.fill_from` (plaintext file to sealed file) and `SealedReader` (sealed "
              "file to plaintext file, every chunk authenticated), against a plain 64 KiB copy of the same file. "
              "*cache*: the writes stay in the page cache; *fsync*: the file is made durable, as production does.",
              "",
              "The *bound* is what doing that same copy and the AEAD one after the other would reach, "
              "1 / (1/copy + 1/AEAD): a process on a shared host gets no second core to overlap them "
              "(Passenger forbids background threads).",
              "", "| size | algorithm | writes | seal MB/s | open MB/s | plain copy MB/s | bound MB/s "
              "| seal / open % of bound | peak RSS seal / open (added by the work) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in results["files"]:
        aead = ceiling["reused_aes"] if row["algorithm"] == "aes-256-gcm" else ceiling["reused_xchacha"]
        bound = 1 / (1 / row["copy"]["mbps"] + 1 / aead)
        lines.append(f"| {label(row['size'])} | {row['algorithm']} | {row['sync']} | {row['seal']['mbps']:,.0f} | "
                     f"{row['open']['mbps']:,.0f} | {row['copy']['mbps']:,.0f} | {bound:,.0f} | "
                     f"{100 * row['seal']['mbps'] / bound:.0f}% / {100 * row['open']['mbps'] / bound:.0f}% | "
                     f"{row['seal']['peak_rss_mb']:.0f} (+{row['seal']['growth_mb']:.1f}) / "
                     f"{row['open']['peak_rss_mb']:.0f} (+{row['open']['growth_mb']:.1f}) MB |")
    lines += ["", "Downloads over loopback HTTP (Werkzeug's server, one request, client reads 1 MiB at a time; "
              "`/files` includes the token, grant and use-count checks, `send_file` reads 8 KiB at a time here "
              "as Werkzeug's server offers no `wsgi.file_wrapper`):", "",
              "| size | served by | MB/s | server peak RSS |", "|---|---|---|---|"]
    for row in results["downloads"]:
        lines.append(f"| {label(row['size'])} | {row['what']} | {row['mbps']:,.0f} | {row['server_peak_rss_mb']:.0f} MB |")
    lines += ["", summary(results)]
    return "\n".join(lines) + "\n"


def summary(results: dict) -> str:
    """The answer to "how close does the file path get", from the numbers above."""
    rows = [r for r in results["files"] if r["algorithm"] == "aes-256-gcm" and r["sync"] == "cache"]
    if not rows:
        return ""
    row = max(rows, key=lambda r: (r["size"] <= 64 * MiB, r["size"]))
    ceiling = results["ceiling"]["reused_aes"]
    bound = 1 / (1 / row["copy"]["mbps"] + 1 / ceiling)
    text = (f"How close: sealing {label(row['size'])} with AES-256-GCM in the page cache runs at "
            f"{row['seal']['mbps']:,.0f} MB/s, {100 * row['seal']['mbps'] / bound:.0f}% of the {bound:,.0f} MB/s bound "
            f"and {100 * row['seal']['mbps'] / ceiling:.0f}% of the AEAD alone. The AEAD into a reused buffer runs at "
            f"{ceiling:,.0f} MB/s, {100 * ceiling / results['ceiling']['pynacl_public_aes'] - 100:.0f}% faster than "
            "PyNaCl's public binding")
    if results["openssl_16k"]:
        text += f" and {100 * ceiling / results['openssl_16k']:.0f}% of `openssl speed`"
    text += (". The rest of the file path's time is the kernel copying the file into and out of the page cache, "
             "which a plain copy pays too; with fsync the disk sets the pace. Memory does not depend on the size.")
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
                          "prepare": case_prepare}[name](*args)))
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
