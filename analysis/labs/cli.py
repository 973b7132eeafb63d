"""`python -m analysis labs <plan|inject-rate|judge|report>`: what roles/labs calls on the controller.

Exit codes as the rest of `analysis`: 0 ok (a lab that is "not supported" or "inconclusive" is a
result, not an error), 2 bad input with one line naming the file or field and the rule.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from analysis.errors import InputError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m analysis labs", description="plan, time and judge the labs")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    s = sub.add_parser("plan", help="validate labs' configurations and print (or write) their plans")
    s.add_argument(
        "--config-json",
        required=True,
        help="one lab's configuration (JSON object: prints its plan) or a list of them (prints {lab: plan})",
    )
    s.add_argument(
        "--write", metavar="DIR", default=None, help="write plan.json + datasets here (a list: DIR/<lab>/)"
    )
    s = sub.add_parser("inject-rate", help="request rate that sends the injection after event N of the probe")
    s.add_argument("probe", help="the probe run's bench.json (the stream alone)")
    s.add_argument("--after-events", type=int, required=True)
    s = sub.add_parser("judge", help="figures, evidence, verdict -> LAB_DIR/lab.json; rebuild labs/report.md")
    s.add_argument("lab_dir")
    s.add_argument("--started-at", type=float, default=None, help="epoch seconds the lab started (wall time)")
    s = sub.add_parser("report", help="rebuild LABS_DIR/report.md from every lab.json")
    s.add_argument("labs_dir")
    return p


def inject_rate(probe: str | Path, after_events: int) -> float:
    """1 / (the probe stream's time to event N, plus half the gap to event N+1)."""
    from analysis.evidence import requests

    result = requests.read_result(probe)
    if result is None:
        raise InputError(probe, None, "missing: the probe run left no result")
    reqs = requests.ok_requests(result)
    times = (reqs[0].get("event_times_s") or []) if reqs else []
    if after_events < 1 or len(times) <= after_events:
        raise InputError(
            probe,
            "requests[0].event_times_s",
            f"{len(times)} events, expected more than --after-events={after_events} (run with "
            "--output-details)",
        )
    t_n, t_next = times[after_events - 1], times[after_events]
    delay = t_n + 0.5 * (t_next - t_n)
    if delay <= 0:
        raise InputError(probe, "requests[0].event_times_s", f"event {after_events} at {t_n} s: expected > 0")
    return 1.0 / delay


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "plan":
        from analysis.labs import plan

        try:
            cfg = orjson.loads(args.config_json)
        except orjson.JSONDecodeError as exc:
            raise InputError(None, "--config-json", f"not JSON ({exc.msg})") from None
        if isinstance(cfg, dict):
            built = plan.build(cfg)
            if args.write:
                plan.write(built, args.write)
            built.pop("_dataset_lines", None)
            sys.stdout.write(orjson.dumps(built).decode() + "\n")
            return 0
        if not isinstance(cfg, list) or not all(isinstance(c, dict) for c in cfg):
            raise InputError(None, "--config-json", "expected a JSON object or a list of objects")
        plans = [plan.build(c) for c in cfg]  # every lab is checked before any is written
        out = {}
        for p in plans:
            if args.write:
                plan.write(p, Path(args.write) / p["lab"])
            p.pop("_dataset_lines", None)
            out[p["lab"]] = p
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
        return 0
    if args.cmd == "inject-rate":
        print(f"{inject_rate(args.probe, args.after_events):.6f}")
        return 0
    if args.cmd == "judge":
        from analysis.labs import judge, report

        doc = judge.judge(args.lab_dir, args.started_at)
        path = report.build(Path(args.lab_dir).parent)
        print(f"{doc['lab']} ({doc['engine']}): {doc['verdict']}: {doc['reason']}")
        print(f"report: {path}")
        return 0
    if args.cmd == "report":
        from analysis.labs import report

        print(report.build(args.labs_dir))
        return 0
    raise AssertionError(args.cmd)  # pragma: no cover
