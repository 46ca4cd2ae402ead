"""``rynn-teleop policy``: learned policies' command line (wired into :mod:`rynn_teleop.cli` by :func:`add_parser`).

    rynn-teleop policy eval PATH --task TASK [--episodes N] [--seed S] [--out DIR] [--max-seconds T] [--no-video]
                                 [--backend NAME] [-p KEY=VALUE ...]

``eval`` scores a policy on fresh twins (:mod:`.evaluate`): PATH is the backend's path setting (``path`` of the
``lerobot`` backend: a policy folder; ``dataset`` of the ``replay`` backend: an exported dataset, with
``-p episode=K``); ``-p`` sets any other setting of the backend. It prints one line per rollout on stderr, then the
summary, and the report folder as the last line. Exit codes as ``rynn-teleop``'s: 0 done (whatever the success
rate), 2 a bad request (an unknown task or backend, a bad setting, a policy refused or one the twin cannot feed, a
used report folder). Also runnable on its own: ``python -m rynn_teleop.policies.cli eval ...``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import yaml

from ..errors import ParameterError, run_command
from .evaluate import DEFAULT_MAX_SECONDS

DEFAULT_BACKEND = "lerobot"
PATH_SETTINGS = {"replay": "dataset"}  # backend -> the setting PATH gives (default: "path")
DEFAULT_OUT = "policy_evals"  # the folder under which a report folder is made when --out is not given


def path_setting(backend: str) -> str:
    """The setting of ``backend`` that the command's PATH gives."""
    return PATH_SETTINGS.get(backend, "path")


def parse_settings(items: list[str], backend: str) -> dict[str, Any]:
    """``-p KEY=VALUE`` items as settings of ``backend`` (``KEY`` may carry the ``<backend>.`` prefix; a value is
    YAML: ``3``, ``true``, ``'text'``; the backend's schema checks them).

    Raises:
        ParameterError: an item without ``=`` or with an empty key, or a value that is not YAML.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().removeprefix(f"{backend}.")
        if not sep or not key:
            raise ParameterError(item, f"-p expects KEY=VALUE (a setting of the {backend} backend), got {item!r}")
        try:
            out[key] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as exc:
            raise ParameterError(key, f"-p {key}: cannot read the value {text!r}: {exc}".replace("\n", " ")) from None
    return out


def _default_out(task: str) -> str:
    name = task.replace("/", "_").removesuffix(".yaml")
    return f"{DEFAULT_OUT}/{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _print_rollout(result) -> None:
    when = f" in {result.time_to_success:.2f} s" if result.time_to_success is not None else ""
    print(f"seed {result.seed}: {result.outcome}{when}: {result.reason} ({result.steps} steps, "
          f"{result.sim_time:.1f} s simulated, {result.wall_s:.1f} s)", file=sys.stderr, flush=True)


def _cmd_eval(args: argparse.Namespace) -> int:
    from .evaluate import EvalSettings, build_runner, evaluate

    settings = EvalSettings(args.task, args.episodes, args.seed, args.max_seconds, not args.no_video)
    backend_settings = parse_settings(args.set, args.backend)
    key = path_setting(args.backend)
    if key in backend_settings:
        raise ParameterError(key, f"-p {key}: PATH gives the {args.backend} backend's {key}; do not set it twice")
    backend_settings[key] = args.path
    runner = build_runner(args.backend, backend_settings)
    try:
        report = evaluate(runner, settings, args.out or _default_out(args.task),
                          policy={"backend": args.backend, "settings": backend_settings}, progress=_print_rollout)
    finally:
        runner.close()
    for line in report.lines():
        print(line)
    print(report.folder)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``policy`` and its subcommands to ``rynn-teleop``'s subparsers; each sets ``func`` (args -> exit code)."""
    p = subparsers.add_parser("policy", help="learned policies: score one on fresh twins")
    sub = p.add_subparsers(dest="policy_command", required=True)
    e = sub.add_parser("eval", help="run N rollouts of a policy on fresh twins with randomised object poses (lockstep "
                       "simulated time, the stack's camera, arm smoothing and safety layer) and score them by the "
                       "task's predicate: success rate with its 95 %% interval, time to success, failure reasons; "
                       "writes a report folder")
    e.add_argument("path", metavar="PATH",
                   help="the policy, the backend's path setting (lerobot: a policy folder; replay: a dataset)")
    e.add_argument("--task", required=True, metavar="TASK",
                   help="a scene in config/sim/ (e.g. pick_place) or a scene YAML")
    e.add_argument("--episodes", type=int, default=10, metavar="N", help="rollouts, one per seed (default 10)")
    e.add_argument("--seed", type=int, default=0, metavar="S",
                   help="the first layout seed: seeds S .. S+N-1 (default 0)")
    e.add_argument("--out", default=None, metavar="DIR",
                   help=f"the report folder (default {DEFAULT_OUT}/<task>-<time>); must not hold files")
    e.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS, metavar="T",
                   help="simulated seconds after which a rollout without success fails "
                   f"(default {DEFAULT_MAX_SECONDS:g})")
    e.add_argument("--no-video", action="store_true", help="write no preview.mp4")
    e.add_argument("--backend", default=DEFAULT_BACKEND, metavar="NAME",
                   help=f"the policy backend (default {DEFAULT_BACKEND}; replay: one recorded episode open-loop)")
    e.add_argument("-p", "--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the backend (e.g. -p episode=3 for replay), repeatable")
    e.set_defaults(func=_cmd_eval)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``policy`` on its own: ``argv`` is what follows ``rynn-teleop policy``."""
    parser = argparse.ArgumentParser(prog="rynn-teleop")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["policy", *(sys.argv[1:] if argv is None else argv)])
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
