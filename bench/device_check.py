"""The agent's NVML path against nvidia-smi's own answer, on a machine with NVIDIA GPUs.

    .venv/bin/python bench/device_check.py [--json]

What the agent reports of each card (`llmgw.agent.gpus.NvmlGpus`: class, health and its
reason, memory used, in use) and what it reads of each process's memory on each card
(`NvmlGpus.processes`: what a sleep is checked against, llmgw.agent.sleep_check) are printed
beside nvidia-smi's answers for the same things (`--query-gpu` and
`--query-compute-apps`), read right after. The NVML path had never run on a real card:
this checks it in one command. Without a card (no driver, no nvidia-smi, NVML finds
none) it prints "no NVIDIA GPU here" and exits 0.

Exit status: 0 when every card and process agrees (memory within 1 % of the card or
256 MiB: the two readings are a moment apart), 1 when something differs, 0 with no GPU.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmgw.agent.gpus import NvmlGpus  # noqa: E402

NO_GPU = "no NVIDIA GPU here"


def smi(query: str, fields: str) -> list[list[str]]:
    """nvidia-smi's CSV answer, one row per card or process (values stripped)."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [[v.strip() for v in row] for row in csv.reader(io.StringIO(out)) if row]


def close(a: int | None, b: int | None, total: int) -> bool:
    if a is None or b is None:
        return a == b
    return abs(a - b) <= max(256, total // 100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = ap.parse_args()

    source = NvmlGpus(watch_xids=False)
    try:
        scan = source.scan()
        procs = source.processes()
    finally:
        source.close()
    if scan.error or not scan.gpus or shutil.which("nvidia-smi") is None:
        why = scan.error or ("nvidia-smi not found" if scan.gpus else "NVML lists no card")
        print(f"{NO_GPU} ({why})")
        return 0

    cards = {r[0]: r for r in smi("gpu", "uuid,name,memory.total,memory.used,index")}
    apps = smi("compute-apps", "pid,gpu_uuid,used_memory")
    rows: list[dict[str, Any]] = []
    ok = True
    for g in scan.gpus:
        uuid = g.mig_parent_uuid or g.uuid
        theirs = cards.get(uuid)
        smi_used = int(theirs[3]) if theirs and theirs[3].isdigit() else None
        agree = theirs is not None and close(g.memory_used_mib, smi_used, g.memory_total_mib)
        ok &= agree
        rows.append(
            {
                "uuid": g.uuid,
                "class": g.gpu_class,
                "health": str(g.health),
                "reason": g.health_reason,
                "in_use": g.in_use,
                "used_mib": g.memory_used_mib,
                "smi_name": theirs[1] if theirs else None,
                "smi_used_mib": smi_used,
                "agree": agree,
            }
        )
    ours = {(p.pid, p.gpu_uuid): p.used_mib for p in procs}
    theirs_p = {(int(a[0]), a[1]): int(a[2]) for a in apps if a[0].isdigit() and a[2].isdigit()}
    processes = []
    for key in sorted(set(ours) | set(theirs_p)):
        total = next((g.memory_total_mib for g in scan.gpus if g.uuid == key[1]), 0)
        agree = close(ours.get(key), theirs_p.get(key), total)
        ok &= agree
        processes.append(
            {
                "pid": key[0],
                "uuid": key[1],
                "used_mib": ours.get(key),
                "smi_used_mib": theirs_p.get(key),
                "agree": agree,
            }
        )
    if args.json:
        print(json.dumps({"cards": rows, "processes": processes, "agree": ok}, indent=1))
    else:
        print(f"{'UUID':<42} {'CLASS':<16} {'HEALTH':<9} {'USED':>7} {'SMI':>7}  OK")
        for r in rows:
            print(
                f"{r['uuid']:<42} {r['class']:<16} {r['health']:<9} "
                f"{r['used_mib'] or '-':>7} {r['smi_used_mib'] or '-':>7}  "
                f"{'yes' if r['agree'] else 'NO'}{'  ' + r['reason'] if r['reason'] else ''}"
            )
        print(f"\n{'PID':>8} {'UUID':<42} {'USED':>7} {'SMI':>7}  OK")
        for p in processes:
            print(
                f"{p['pid']:>8} {p['uuid']:<42} {p['used_mib'] or '-':>7} "
                f"{p['smi_used_mib'] or '-':>7}  {'yes' if p['agree'] else 'NO'}"
            )
        print("\nthe agent agrees with nvidia-smi" if ok else "\nthe agent DIFFERS from nvidia-smi")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
