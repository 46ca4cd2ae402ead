"""``rynn-teleop``: the project's command line.

    rynn-teleop urdf [--config OVERLAY.yaml] [--output FILE | --compare FILE]
    rynn-teleop params NODE           print NODE's parameter file with every key documented
    rynn-teleop run NODE [NODE ...] [--duration S] [--config-dir DIR] [-p NODE.KEY=VALUE ...]
    rynn-teleop run --mode digital|real [--camera generated|physical] [--record] [--tracker-backend NAME] ...
                                      one process per process group, as the launch file (--one-process: one)
    rynn-teleop run --mode digital|real --policy PATH [--policy-backend NAME] ...   a policy instead of the operator
                                      (acts once started: rynn-teleop call policy start)
    rynn-teleop lifecycle active|inactive|unconfigured [NODE ...]   bring managed nodes (the drivers) there, in order
    rynn-teleop demo [--duration S] [--out DIR]
    rynn-teleop sim export-model [OUT] [--scene S] [--seed N]   the physics twin's MJCF (opens in MuJoCo's viewer)
    rynn-teleop sim run --scene S --seeds 0-19 | sim scenes      scripted task episodes in pure physics; the scenes
    rynn-teleop episodes list|info|check|recover|export PATH   recorded episodes (integrity, counts, rates, gaps,
                                      plot, preview, salvage, LeRobot export)
    rynn-teleop episodes replay EPISODE [--twin]   its commands through the drivers again; on a twin, the outcome
    rynn-teleop policy eval PATH --task T [--episodes N] [--seed S]   a trained policy's rollouts on fresh twins:
                                      success rate with its 95 % interval, time to success, a report folder
    rynn-teleop world-model encode-prompt BASE_DIR "PROMPT" OUT   the world model's fixed prompt, encoded once
    rynn-teleop world-model dataset|tiny-base|train|distill|eval|judge ...   make and judge world-model weights
    rynn-teleop world-model judge EPISODE... --out DIR   digital episodes' commands on the twin beside what the
                                      generated video shows at the end

Exit codes: 0 done; 1 the data is at fault (a damaged or unreadable episode, a failed check); 2 the request
(bad arguments, a path that does not exist or is of the wrong kind, an output that cannot be written); 130
interrupted. Errors are one line on standard error, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Any

import yaml

from . import bringup
from .errors import RynnTeleopError, run_command


def _cmd_urdf(args: argparse.Namespace) -> int:
    from xml.etree.ElementTree import ParseError

    from .core.urdf_builder import build_urdf

    text = build_urdf(args.config)
    if args.compare:
        from .core.urdf_compare import urdf_differences

        try:
            with open(args.compare, encoding="utf-8") as f:
                other = f.read()
        except UnicodeDecodeError as exc:
            raise RynnTeleopError(f"--compare {args.compare}: not a URDF (not UTF-8 text: {exc})") from None
        except OSError as exc:
            raise RynnTeleopError(f"cannot read --compare {args.compare}: {exc.strerror or exc}") from None
        try:
            differences = urdf_differences(text, other)
        except ParseError as exc:
            raise RynnTeleopError(f"--compare {args.compare}: not a URDF (XML: {exc})") from None
        for line in differences:
            print(f"{args.compare}: {line}", file=sys.stderr)
        return 1 if differences else 0
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise RynnTeleopError(f"cannot write --output {args.output}: {exc.strerror or exc}") from None
    else:
        sys.stdout.write(text)
    return 0


def _cmd_episodes(args: argparse.Namespace) -> int:
    from .recording.inspect import episodes_main

    def replay(parsed: argparse.Namespace) -> int:  # needs ROS: imported only for this subcommand
        from .replay import main

        return main(parsed)

    return episodes_main(args.args, replay=replay)


def _cmd_params(args: argparse.Namespace) -> int:
    from .nodes import node_class

    sys.stdout.write(node_class(args.node).SCHEMA.to_yaml())
    return 0


class _ValueLoader(yaml.SafeLoader):
    """YAML as ``yaml.safe_load`` reads it, plus the numbers users write that YAML 1.1 reads as strings:
    exponents without a dot or without a sign (``1e9``, ``1.5e3``, ``2.0E-3``, ``.5e1``)."""


_ValueLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_value(text: str) -> Any:
    """A ``-p NODE.KEY=VALUE`` value as a user writes it: YAML (``true``, ``[1, 2]``, ``'text'``), with numbers
    in any usual form (``1e9``, ``2.0E-3``, ``.5``, ``-3``) as numbers; the node's schema range-checks them.

    Raises:
        RynnTeleopError: the text is not YAML (the message says where).
    """
    try:
        return yaml.load(text, Loader=_ValueLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        raise RynnTeleopError(f"cannot read the value {text!r}: {exc}".replace("\n", " ")) from None


def _parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        node, dot, param = key.partition(".")
        if not sep or not dot or not node or not param:
            raise RynnTeleopError(f"-p expects NODE.KEY=VALUE, got {item!r}")
        out.setdefault(node, {})[param] = parse_value(value)
    return out


def _check_overrides(nodes: list[str], overrides: dict[str, dict[str, Any]]) -> None:
    """Every override names a started node and a parameter of it, with a value its schema accepts (type and
    range), before anything starts.

    Raises:
        RynnTeleopError: naming the node, key and range.
    """
    from .nodes import node_class

    for node, values in overrides.items():
        if node not in nodes:
            raise RynnTeleopError(f"-p {node}.*: node {node!r} is not started (started: {', '.join(nodes)})")
        node_class(node).SCHEMA.validate(values)


def _run_plan(args: argparse.Namespace) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The nodes and parameter overrides of ``run``: a mode's (``--mode``) or the named nodes, then ``-p``."""

    overrides: dict[str, dict[str, Any]] = {}
    nodes = list(args.nodes)
    if args.mode:
        try:
            overrides = bringup.mode_overrides(args.mode, camera=args.camera, policy=args.policy,
                                               **{name: getattr(args, name) for name in bringup.BACKEND_ARGUMENTS})
        except ValueError as exc:
            raise RynnTeleopError(str(exc)) from None
        nodes = nodes or list(bringup.mode_nodes(record=args.record, console=args.console, foxglove=args.foxglove,
                                                 mode=args.mode, policy=bool(args.policy)))
    elif not nodes:
        raise RynnTeleopError("run: name the nodes to start, or give --mode digital|real")
    elif args.policy:  # named nodes: the policy node's path
        overrides[bringup.POLICY] = {"path": args.policy}
    if args.policy and bringup.POLICY not in nodes:
        raise RynnTeleopError(f"--policy {args.policy}: the policy node is not started (started: "
                              f"{', '.join(nodes)}); leave out the node names, or name policy")
    overrides = {n: v for n, v in overrides.items() if n in nodes}  # a subset of a mode keeps its backends
    if args.policy and bringup.RECORDER in nodes:  # no operator input runs: its topics are not expected
        from .recording import OPERATOR_INPUT_TOPICS

        overrides.setdefault(bringup.RECORDER, {})["exclude_topics"] = list(OPERATOR_INPUT_TOPICS)
    for node, values in _parse_overrides(args.param).items():
        overrides.setdefault(node, {}).update(values)
    if args.config_dir is not None and not os.path.isdir(args.config_dir):
        raise RynnTeleopError(f"--config-dir {args.config_dir}: not a folder (it should hold <node>.yaml files)")
    _check_overrides(nodes, overrides)
    return nodes, overrides


def _cmd_run(args: argparse.Namespace) -> int:
    from .nodes.process import freeze_startup_objects, release_startup_objects
    from .supervisor import report_ready, run_groups

    _stop_on_signals()
    nodes, overrides = _run_plan(args)
    groups = bringup.process_groups(nodes) if args.mode and not args.one_process else (tuple(nodes),)
    if len(groups) > 1:  # a process per group of the bringup table, as the launch file (supervisor)
        return run_groups(groups, overrides, lifecycle=args.lifecycle, duration=args.duration,
                          config_dir=args.config_dir)
    from .runner import Composition

    try:
        with Composition(nodes, config_dir=args.config_dir, overrides=overrides, lifecycle=args.lifecycle) as comp:
            freeze_startup_objects()
            for node in comp.nodes:
                node.get_logger().info("started")
            report_ready()
            comp.spin(args.duration)
    finally:
        comp = node = None  # the last references to the nodes, before the collection
        release_startup_objects()
    return 0


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop_on_signals() -> None:
    """SIGINT (Ctrl-C, launch, the demo) and SIGTERM (kill, docker stop) end a run as KeyboardInterrupt in the
    main thread, so nodes shut down cleanly; also when the process was started with SIGINT ignored (a
    background job of a script), which would otherwise make it deaf to the SIGINT that stops it."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def _cmd_demo(args: argparse.Namespace) -> int:
    _stop_on_signals()  # the groups are stopped however the demo is
    # The demo is self-contained: keep DDS on this machine unless told otherwise.
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    from .demo import run_demo, run_interactive

    if args.interactive:
        print(run_interactive(out_dir=args.out, port=args.port, duration=args.duration))
        return 0
    out = run_demo(duration=20.0 if args.duration is None else args.duration, out_dir=args.out)
    print(out)
    return 0


def _cmd_docs(args: argparse.Namespace) -> int:
    """Serve (or build) the documentation site of a source tree with MkDocs (its reference pages are generated
    from the code at every build by docs/gen_reference.py)."""
    import importlib.util
    import subprocess

    from .paths import share_dir

    config = share_dir() / "mkdocs.yml"  # the repository root in a source tree; an installed package has none
    if not config.is_file():
        raise RynnTeleopError(f"the documentation site is built from a source tree, and {config} does not exist")
    if importlib.util.find_spec("mkdocs") is None:
        raise RynnTeleopError("mkdocs is not installed: pip install -c requirements/constraints.txt "
                              "-r requirements/docs.txt (./scripts/bootstrap.sh does)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    if args.build:
        return subprocess.call([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)], env=env)
    return subprocess.call([sys.executable, "-m", "mkdocs", "serve", "-f", str(config),
                            "-a", f"127.0.0.1:{args.port}"], env=env)


def _cmd_encode_prompt(args: argparse.Namespace) -> int:
    from .world_model.diffusion.weights import encode_prompt  # imports torch and transformers

    embeds = encode_prompt(args.base_dir, args.prompt, args.out, max_length=args.max_length)
    print(f"{args.out}: prompt embeddings {tuple(embeds.shape)}")
    return 0


#: ``world-model`` tools of ``rynn_teleop.world_model.training``: name -> (module, help). Each module has
#: ``add_arguments(parser)`` and ``run_cli(args)``; it is imported (torch and all) only when its tool runs.
TRAINING_TOOLS = {
    "dataset": ("dataset", "clips of 1 + 4k frames with actions and condition images from recorded episodes"),
    "tiny-base": ("tiny_base", "fit the tiny preset's VAE to a dataset and write a tiny base release (CPU runs)"),
    "train": ("train", "stage-1 teacher: the Wan2.2 DiT + control branch on a dataset (CONFIG.yaml; accelerate)"),
    "distill": ("distill", "the causal 4-step student the node runs, from a teacher (CONFIG.yaml; CausVid ODE "
                "pairs)"),
    "eval": ("evaluate", "PSNR/SSIM/LPIPS of weights on held-out clips against the render backend and the "
             "repeat-the-first-frame baseline; plots and a side-by-side video"),
    "tune-composite": ("tune_composite", "choose a trained model's reference-compositing settings (thresholds, "
                       "blur, reach) on its dataset's training clips: tune_composite.json and the diffusion "
                       "backend's composite_* parameters"),
    "judge": ("judge", "replay digital episodes' commands on the twin and set its outcome beside what the generated "
              "video shows at the end (object in the target or not): judge.json and a strip per episode"),
}


def _cmd_training(args: argparse.Namespace) -> int:
    from importlib import import_module

    module_name, help_text = TRAINING_TOOLS[args.tool]
    module = import_module(f".world_model.training.{module_name}", __package__)
    parser = argparse.ArgumentParser(prog=f"rynn-teleop world-model {args.tool}", description=help_text)
    module.add_arguments(parser)
    return module.run_cli(parser.parse_args(args.args))


def _cmd_lifecycle(args: argparse.Namespace) -> int:
    from .nodes.lifecycle_manager import manage

    return manage(args.goal, args.nodes or list(bringup.MANAGED_NODES), timeout=args.timeout)


def _cmd_call(args: argparse.Namespace) -> int:
    from .nodes.operator import call_main

    return call_main(args.args)


def _seconds(text: str) -> float:
    """A duration argument [s]: a number as a user writes it (``20``, ``1e3``, ``.5``), finite and > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be a finite number of seconds > 0")
    return value


def _port(text: str) -> int:
    """A TCP port argument: an integer in 1..65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is an integer in 1..65535")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rynn-teleop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("urdf", help="print the robot's URDF")
    p.add_argument("--config", help="YAML overriding urdf/robot.yaml (mounts, adapters, camera, limits)")
    p.add_argument("--output", "-o", help="write to this file instead of standard output")
    p.add_argument("--compare", metavar="FILE", help="exit 1 (listing the differences) unless FILE is this URDF: "
                   "same elements and attributes, numbers equal within 1e-12")
    p.set_defaults(func=_cmd_urdf)

    from .sim import cli as sim_cli  # imports no MuJoCo until a sim subcommand runs

    sim_cli.add_parser(sub)
    from .policies import cli as policy_cli  # MuJoCo, the camera and the policy load only when `policy eval` runs

    policy_cli.add_parser(sub)

    p = sub.add_parser("params", help="print a node's parameter file, every key documented")
    p.add_argument("node")
    p.set_defaults(func=_cmd_params)

    p = sub.add_parser("run", help="run nodes (no launch_ros needed): the named ones in this process; with --mode "
                       "one process per process group of the bringup table, as the launch file runs them")
    p.add_argument("nodes", nargs="*", help="node names (see the README's node table); default with --mode: all")
    p.add_argument("--mode", choices=bringup.MODES, help="the bringup's node set and backends "
                   "(digital: sim drivers, world model, generated feed; real: vendor backends)")
    p.add_argument("--camera", choices=bringup.CAMERAS, help="initial feed (default: by mode)")
    p.add_argument("--record", action="store_true", help="with --mode: also start the recorder")
    p.add_argument("--console", action="store_true", help="with --mode: also start the operator console "
                   "(web page, default http://127.0.0.1:8080/)")
    p.add_argument("--foxglove", action="store_true", help="with --mode: also serve the topics to the Foxglove app "
                   "(ws://127.0.0.1:8765; no foxglove_bridge needed)")
    for name in bringup.BACKEND_ARGUMENTS:  # --tracker-backend, --hand-retarget-backend, --world-model-backend
        arg = bringup.argument(name)
        p.add_argument("--" + name.replace("_", "-"), choices=arg.choices,
                       help=f"{arg.description} (default: the YAML's)")
    p.add_argument("--policy", default=None, metavar="PATH", help="a policy to run instead of the operator input "
                   "(with --mode: the policy node replaces tracker, arm_ik and hand_retarget): its path, the "
                   "backend's path setting (lerobot: a lerobot-train output folder; replay: an exported dataset); it "
                   "acts once started (rynn-teleop call policy start, the console)")
    p.add_argument("--one-process", action="store_true", help="with --mode: every node in this one process (one "
                   "interpreter for all: the 200 Hz loops then miss ticks while the camera and world model compute)")
    p.add_argument("--duration", type=_seconds, default=None, help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("--config-dir", default=None, help="folder with <node>.yaml files (default: the package's config/)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NODE.KEY=VALUE", help="override a parameter")
    p.add_argument("--lifecycle", choices=bringup.LIFECYCLE_GOALS, default="active",
                   help="the state the managed nodes (the drivers) are brought to, in order: active (default), "
                   "inactive (connected, commanding nothing) or unconfigured (nothing connected: use "
                   "`rynn-teleop lifecycle` or `ros2 lifecycle set`)")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("lifecycle", help="bring running managed nodes (the drivers) to a lifecycle state, in order "
                       "(all configured before any is activated; down in reverse order)")
    p.add_argument("goal", choices=bringup.LIFECYCLE_GOALS, help="active: connected and following commands; "
                   "inactive: connected, commanding nothing; unconfigured: disconnected")
    p.add_argument("nodes", nargs="*", help="the nodes, in bring-up order (default: the bringup's managed nodes: "
                   "arm_driver, hand_driver)")
    p.add_argument("--timeout", type=_seconds, default=10.0, help="seconds to wait for each node's services and "
                   "answers (default 10)")
    p.set_defaults(func=_cmd_lifecycle)

    p = sub.add_parser("episodes", add_help=False,
                       help="recorded episodes: list|info|check|recover|export|replay (see `rynn-teleop episodes "
                            "--help`)")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_episodes)

    p = sub.add_parser("call", add_help=False, help="operate a running stack: calibrate|engage|disengage|estop|"
                       "reset|feed ...|episode ...|twin reset|policy start|stop|status (see `rynn-teleop call "
                       "--help`)")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_call)

    p = sub.add_parser("world-model", help="the learned world model's offline tools")
    tools = p.add_subparsers(dest="tool", required=True)
    t = tools.add_parser("encode-prompt", help="encode the world model's fixed prompt with the base release's UMT5 "
                         "text encoder (BASE_DIR/text_encoder, BASE_DIR/tokenizer) into a file the node loads")
    t.add_argument("base_dir", help="a local Wan2.2-TI2V-5B-Diffusers folder (or one in its layout)")
    t.add_argument("prompt", help="the prompt text, e.g. 'a robot arm moves objects on a table'")
    t.add_argument("out", help="output file (.safetensors): world_model's diffusion.prompt_file")
    t.add_argument("--max-length", type=int, default=512, help="tokens (the release's UMT5 length: 512)")
    t.set_defaults(func=_cmd_encode_prompt)
    for name, (_, help_text) in TRAINING_TOOLS.items():
        t = tools.add_parser(name, help=help_text, add_help=False)
        t.add_argument("args", nargs=argparse.REMAINDER)
        t.set_defaults(func=_cmd_training)

    p = sub.add_parser("demo", help="the most complete end-to-end run that needs no hardware")
    p.add_argument("--duration", type=_seconds, default=None,
                   help="seconds of the episode (default 20); --interactive: of the run (default: until Ctrl-C)")
    p.add_argument("--out", default=None, help="output folder (default: a new folder under ./demo_runs)")
    p.add_argument("--interactive", action="store_true", help="run the stack with the operator console until "
                   "Ctrl-C (--duration: stop after S seconds); you record episodes from the page")
    p.add_argument("--port", type=_port, default=8080, help="--interactive: the console's port on 127.0.0.1")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("docs", help="serve the documentation site on http://127.0.0.1:8000/ (rebuilt on change)")
    p.add_argument("--port", type=_port, default=8000, help="port on 127.0.0.1 (default 8000)")
    p.add_argument("--build", action="store_true", help="build the site into site/ (strict) instead, and exit")
    p.set_defaults(func=_cmd_docs)
    return parser


#: subcommands with their own parsers: everything after the name is theirs (``--help`` included)
DELEGATED = {"episodes": _cmd_episodes, "call": _cmd_call}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        args = argparse.Namespace(command=argv[0], args=argv[1:], func=DELEGATED[argv[0]])
    elif argv[:1] == ["world-model"] and len(argv) > 1 and argv[1] in TRAINING_TOOLS:  # their own parsers
        args = argparse.Namespace(command=argv[0], tool=argv[1], args=argv[2:], func=_cmd_training)
    else:
        args = build_parser().parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
