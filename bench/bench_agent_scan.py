"""Agent storage scan and report cycle: prints figures, asserts nothing.

    python bench/bench_agent_scan.py [--models 50] [--files 5000]

- first scan of 50 models / 5,000 files (every header read; the OS page cache
  is warm, since the files were just written), and a repeat scan (headers
  cached by inode, size and mtime; target under 50 ms);
- CPU time of one report cycle (8 fake GPUs + that storage, built and
  serialised to JSON);
- resident memory of a real `llmgw agent` process scanning that directory
  (target under 80 MB).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llmgw.agent.fake_gpus import FakeGpus, parse_fake_spec
from llmgw.agent.report import ReportBuilder
from llmgw.agent.sample_models import write_model
from llmgw.agent.storage import StorageDir, StorageScanner


def make_tree(root: Path, models: int, files: int) -> int:
    # Each model: config.json + index + shards; spread the files evenly.
    shards = max(1, files // models - 2)
    for i in range(models):
        write_model(root / f"org{i % 5}" / f"model-{i:03d}", shards=shards, tensors=2)
    return sum(len(fs) for _, _, fs in os.walk(root))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def agent_rss(storage: Path, seconds: float = 4.0) -> float:
    with tempfile.TemporaryDirectory() as state:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llmgw",
                "agent",
                "--node",
                "bench",
                "--interval",
                "1",
                "--fake-gpus",
                "8xH100-80GB",
                "--storage",
                str(storage),
                "--state-dir",
                state,
                "--controller",
                "http://127.0.0.1:9",  # nothing there: the agent keeps trying
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(seconds)
            return rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} (timings scale with it)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        t0 = time.perf_counter()
        count = make_tree(root, args.models, args.files)
        print(
            f"tree: {args.models} models, {count} files ({time.perf_counter() - t0:.1f} s to write)"
        )

        scanner = StorageScanner([StorageDir(str(root))])
        t0 = time.perf_counter()
        (location,) = scanner.scan()
        first = time.perf_counter() - t0
        assert len(location.models) == args.models, location.incomplete[:3]
        print(f"first scan:  {first * 1000:8.1f} ms  ({scanner.cache.reads} files opened)")

        reads = scanner.cache.reads
        times, cpu_times = [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            scanner.scan()
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
        # On a shared machine wall time includes waiting for a CPU; CPU time does not.
        print(
            f"repeat scan: {statistics.median(times) * 1000:8.1f} ms median wall, "
            f"{min(times) * 1000:.1f} ms min, {statistics.median(cpu_times) * 1000:.1f} ms CPU "
            f"over {args.repeats} ({scanner.cache.reads - reads} files opened)"
        )

        builder = ReportBuilder(
            node="bench",
            gpus=FakeGpus("bench", [parse_fake_spec("8xH100-80GB")]),
            storage=scanner,
            boot_id="bench",
        )
        cpu = []
        for _ in range(args.repeats):
            t0 = time.process_time()
            body = builder.build().model_dump_json()
            cpu.append(time.process_time() - t0)
        print(
            f"report cycle: {statistics.median(cpu) * 1000:7.1f} ms CPU median "
            f"(build + JSON, {len(body) / 1024:.0f} KiB body)"
        )
        floor = []
        dirs = [d for d, _, fs in os.walk(root) if fs]
        for _ in range(5):
            t0 = time.perf_counter()
            for d in dirs:
                for entry in os.scandir(d):
                    entry.stat()
            floor.append(time.perf_counter() - t0)
        print(f"floor (scandir + stat of every file, nothing else): {min(floor) * 1000:.1f} ms")
        print(f"this process RSS: {rss_mib(os.getpid()):.0f} MiB")
        print(f"llmgw agent RSS:  {agent_rss(root):.0f} MiB (8 fake GPUs, this storage, reporting)")


if __name__ == "__main__":
    main()
