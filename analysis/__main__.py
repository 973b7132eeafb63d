"""``python -m analysis <subcommand>``: the CLI the Ansible roles and people call.

Imports are lazy: the state subcommands (write-case, case-done, check-bench, ...) run once per
case from Ansible and must start fast, so numpy/matplotlib/scipy load only for ``summarize``.
Exit codes: 0 ok, 1 "not done / check failed" (with one line saying why), 2 bad input, 3 (summarize
only) the report was written but some result files could not be read (they are listed in it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from analysis.errors import InputError
from analysis.vocabulary import ERROR_TYPES, RUN_STATUSES


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected an integer > 0") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"got {value}, expected an integer > 0")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected a number 0 < f <= 1") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"got {value:g}, expected a number 0 < f <= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m analysis", description="quickmap analysis and case/run state")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    s = sub.add_parser("validate-scenarios", help="check the scenario TSV and print the plan")
    s.add_argument("file")
    s.add_argument("--case-ids", default=None, help="comma-separated subset (unknown ids are an error)")
    s.add_argument("--json", action="store_true", help="print the plan as a JSON list")

    s = sub.add_parser("write-case", help="merge fields into CASE_DIR/meta.json and set its status")
    s.add_argument("case_dir")
    s.add_argument("--status", required=True, choices=("planned", "running", "completed"))
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--set-json", action="append", default=[], metavar="KEY=JSON")

    s = sub.add_parser("mark-case-failed", help="set status failed with an error type")
    s.add_argument("case_dir")
    s.add_argument("--error-type", required=True, choices=ERROR_TYPES)
    s.add_argument("--reason", default=None)

    s = sub.add_parser("classify-failure", help="print the error type of a failed case")
    s.add_argument("case_dir")
    s.add_argument("--server-log", default=None)
    s.add_argument("--health-url", default=None)
    s.add_argument("--timed-out", action="store_true")

    s = sub.add_parser("write-manifest", help="merge fields into RUN_DIR/manifest.json")
    s.add_argument("run_dir")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--set-json", action="append", default=[], metavar="KEY=JSON")
    s.add_argument("--nccl-env", action="append", default=[], metavar="NAME=VALUE")
    s.add_argument("--status", choices=("running",), default=None, help="reopen a resumed run")

    s = sub.add_parser("complete-manifest", help="record end time, status and case counts")
    s.add_argument("run_dir")
    s.add_argument("--status", required=True, choices=RUN_STATUSES)

    s = sub.add_parser("check-bench", help="exit 0 only if the result file shows N completed requests")
    s.add_argument("file")
    s.add_argument("--expect-requests", required=True, type=_positive_int)
    s.add_argument("--expect-output-len", type=_positive_int, default=None)
    s.add_argument(
        "--min-output-fraction",
        type=_fraction,
        default=1.0,
        help="share of completed requests that must reach the OSL (bench_case's min_output_fraction)",
    )

    s = sub.add_parser("case-done", help="resume test: meta completed AND bench.json complete")
    s.add_argument("case_dir")
    s.add_argument("--expect-requests", type=_positive_int, default=None)

    s = sub.add_parser("check-overlap", help="A/B proof: the injection landed in the background's main phase")
    s.add_argument("rep_dir", help="mixed/rep<N> (holds decode_background/ and prefill_injection/)")
    s.add_argument(
        "--not-sent",
        default=None,
        metavar="REASON",
        help="the injection was not sent (why): no overlap, both roles failed, no result read",
    )

    s = sub.add_parser("summarize", help="summary.csv/jsonl, aggregate.csv, report.md, plots/")
    s.add_argument("run_dir")

    s = sub.add_parser(
        "labs", help="the labs: plan | inject-rate | judge | report (see analysis/labs)", add_help=False
    )
    s.add_argument("labs_args", nargs=argparse.REMAINDER)
    return p


def _run(args: argparse.Namespace) -> int:
    cmd = args.cmd
    if cmd == "validate-scenarios":
        from analysis import scenarios

        cases = scenarios.select_cases(args.file, scenarios.load_scenarios(args.file), args.case_ids)
        if args.json:
            import orjson

            sys.stdout.write(
                orjson.dumps([c.as_dict() for c in cases], option=orjson.OPT_INDENT_2).decode() + "\n"
            )
        else:
            print(scenarios.format_table(cases))
        return 0
    if cmd == "summarize":
        from analysis.summarize import summarize_run

        done = summarize_run(args.run_dir)
        print(done.message)
        for path, why in done.unreadable:
            print(f"summarize: unreadable result {path}: {why}", file=sys.stderr)
        return 3 if done.unreadable else 0

    from analysis import state

    if cmd == "write-case":
        print(
            state.write_case(
                args.case_dir,
                args.status,
                state.parse_assignments(args.set, args.set_json, f"{args.case_dir}/meta.json"),
            )
        )
        return 0
    if cmd == "mark-case-failed":
        print(state.mark_case_failed(args.case_dir, args.error_type, args.reason))
        return 0
    if cmd == "classify-failure":
        kind, evidence = state.classify_failure(
            args.case_dir, args.server_log, args.health_url, args.timed_out
        )
        print(kind)
        print(f"classify-failure: {kind}: {evidence}", file=sys.stderr)
        return 0
    if cmd == "write-manifest":
        print(
            state.write_manifest(
                args.run_dir,
                state.parse_assignments(args.set, args.set_json, f"{args.run_dir}/manifest.json"),
                args.nccl_env,
                args.status,
            )
        )
        return 0
    if cmd == "complete-manifest":
        print(state.complete_manifest(args.run_dir, args.status))
        return 0
    if cmd == "check-overlap":
        from analysis.overlap import check_overlap

        code, msg = check_overlap(args.rep_dir, args.not_sent)
    elif cmd == "check-bench":
        code, msg = state.check_bench(
            args.file, args.expect_requests, args.expect_output_len, args.min_output_fraction
        )
    elif cmd == "case-done":
        code, msg = state.case_done(args.case_dir, args.expect_requests)
    else:  # pragma: no cover - argparse rejects unknown subcommands
        raise AssertionError(cmd)
    print(msg)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["labs"]:  # its own parser (analysis/labs/cli.py), so `labs --help` reaches it
        from analysis.labs.cli import main as labs_main

        try:
            return labs_main(argv[1:])
        except InputError as exc:
            print(f"labs: error: {exc}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except InputError as exc:
        print(f"{args.cmd}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
