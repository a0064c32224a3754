"""What the hardening costs per report, in process: strict validation against
main's lax wire types (the baseline, loaded from git in the same run), and the
node authorizer plus credential lookup on top.

    python bench/bench_hardening.py [--reports 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

from bench_controller import synthetic_report

from llmgw.controller.core.auth import Identity, Role, Tokens
from llmgw.controller.http.authorize import report_refusal
from llmgw.controller.state.credentials import Credentials
from llmgw.controller.store import Store
from llmgw.wire import NodeReport, validate_json


def baseline_wire(ref: str) -> ModuleType | None:
    """`llmgw/wire.py` as it is on `ref` (before strict types), as a module."""
    try:
        source = subprocess.run(
            ["git", "show", f"{ref}:llmgw/wire.py"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "wire_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("wire_baseline", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["wire_baseline"] = module
    spec.loader.exec_module(module)
    return module


def per_report_us(fn, bodies: list[bytes], rounds: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for b in bodies:
            fn(b)
        times.append((time.perf_counter() - t) / len(bodies) * 1e6)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reports", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--baseline-ref", default="6e994d4", help="git ref before strict types")
    args = p.parse_args()
    bodies = [json.dumps(synthetic_report(i)).encode() for i in range(args.reports)]
    old = baseline_wire(args.baseline_ref)
    if old is None:
        sys.exit("cannot load the baseline wire.py from git")
    fns = {
        "lax": old.NodeReport.model_validate_json,
        "strict": NodeReport.model_validate_json,
        "controller": lambda b: validate_json(NodeReport, b),
    }
    runs: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.rounds):  # interleaved: the machine's load hits each alike
        for k, fn in fns.items():
            runs[k].append(per_report_us(fn, bodies, 1))
    lax, strict, lean = (statistics.median(runs[k]) for k in fns)

    with tempfile.TemporaryDirectory() as d:
        creds = Credentials(Store(Path(d)), Tokens())
        secrets = {
            f"node{i:05d}": creds.enroll(f"node{i:05d}", by="bench", at=0.0) for i in range(200)
        }
        reports = [NodeReport.model_validate_json(b) for b in bodies]
        token = next(iter(secrets.values()))

        def authorize(i: int) -> None:
            node = creds.identify(token)
            report_refusal(Identity(node or "", Role.AGENT, reports[i].node), reports[i], {})

        t = time.perf_counter()
        for _ in range(args.rounds):
            for i in range(len(reports)):
                authorize(i)
        authz = (time.perf_counter() - t) / (args.rounds * len(reports)) * 1e6

    size = sum(map(len, bodies)) / len(bodies)
    print(f"{args.reports} synthetic reports ({size / 1024:.1f} KiB each), median of {args.rounds}")
    print(f"  baseline (lax wire types, {args.baseline_ref}): {lax:8.1f} us/report")
    print(f"  strict wire types:                  {strict:8.1f} us/report  ({strict / lax:.2f} x)")
    print(
        f"  strict, as the controller validates a body (wire.validate_json): "
        f"{lean:.1f} us/report  ({lean / lax:.2f} x)"
    )
    print(
        f"  node authorizer + credential lookup: {authz:7.1f} us/report  ({authz / lax:.2f} x of baseline parse)"
    )


if __name__ == "__main__":
    main()
