"""The documentation site's reference pages, generated from the code (never hand-copied).

An MkDocs hook (``hooks:`` in ``mkdocs.yml``): every build, ``mkdocs build`` and ``mkdocs serve`` alike,
generates the pages below from the declarations in the code and adds them to the site, so a reference page
cannot go stale; ``mkdocs build --strict`` (``scripts/test.sh``) fails where a page links to one that is no
longer generated. Pages (paths relative to ``docs/``):

* ``reference/nodes/index.md`` and ``reference/nodes/<node>.md``: every node of
  :data:`rynn_teleop.nodes.REGISTRY`, its parameters from its declared ``SCHEMA`` (type, default, units,
  range, description: what ``rynn-teleop params NODE`` prints), its topics, services and diagnostics from
  its module docstring, its scheduling class (``PRIORITY``) and its place in the bringup table;
* ``reference/cli.md``: ``rynn-teleop --help`` and every subcommand's help, from ``cli.build_parser()`` and
  the parsers it delegates to (``episodes``, ``call``, the ``world-model`` training tools);
* ``reference/launch.md``: the launch arguments, nodes and mode backends of ``rynn_teleop.bringup``;
* ``reference/run-configs.md``: the keys of ``world-model train`` / ``distill`` run configurations;
* ``reference/benches.md``: the docstring of every ``bench/*.py`` script (how it runs, its baseline).

Run as a script to write the pages to a folder (to read or diff them without building the site)::

    .venv/bin/python docs/gen_reference.py --out /tmp/reference
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
NODES_DIR = "reference/nodes"  # the node pages, relative to docs/
NODE_NAV_ANCHOR = f"{NODES_DIR}/index.md"  # the nav list this hook appends one entry per node to
HELP_COLUMNS = "100"  # [characters] argparse's line width in the command-line page (fixed: same page everywhere)


# ---------------------------------------------------------------------- markdown helpers
def cell(text: Any) -> str:
    """``text`` safe inside a markdown table cell: HTML special characters, pipes, asterisks and newlines."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "\\|").replace("*", "\\*").replace("\n", " ")


def inline(text: str) -> str:
    """A docstring line as markdown: reST literals (````x````, ``:role:`x```) become code spans, the rest
    :func:`cell`-escaped."""
    parts = re.split(r"``(.+?)``|:[a-z]+:`~?\.?([^`]+)`", text)
    out = []
    for i, part in enumerate(parts):
        if part is None:
            continue
        out.append(code(part) if i % 3 else cell(part))
    return "".join(out)


def code(text: Any) -> str:
    """``text`` as an inline code span inside a table cell (backticks in it lengthen the fence)."""
    text = str(text).replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}" if text else ""


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def text_block(text: str) -> str:
    """``text`` verbatim in a fenced block (a longer fence where the text holds one)."""
    fence = "````" if "```" in text else "```"
    return f"{fence}text\n{text.rstrip()}\n{fence}\n"


def yaml_value(value: Any) -> str:
    """A value as a ROS parameter file writes it (``rynn-teleop params`` uses the same flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf)
    return text.strip().removesuffix("...").strip()


def generated_note(source: str) -> str:
    return (f'!!! info "Generated from the code"\n    This page is generated at every build of the site from '
            f"{source} (`docs/gen_reference.py`); edit the code, not the page.\n")


def module_docstring(path: Path) -> str:
    """The docstring of the Python file ``path`` (without importing it); ``""`` if it has none."""
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path))) or ""


# ---------------------------------------------------------------------- nodes and parameters
def node_names() -> list[str]:
    from rynn_teleop.nodes import REGISTRY

    return list(REGISTRY)


def node_summary(name: str) -> str:
    """The first line of the node module's docstring, without its ``<name> node:`` prefix."""
    from rynn_teleop.nodes import REGISTRY

    module = sys.modules.get(REGISTRY[name].partition(":")[0])
    first = ((module.__doc__ if module else "") or "").strip().splitlines()[:1]
    summary = (first[0] if first else "").removeprefix(f"{name} node:").strip()
    return summary[:1].upper() + summary[1:]


def param_rows(schema, prefix: str = "p-") -> list[list[str]]:
    """One table row per parameter of ``schema``: name, type, default, units, allowed values, description.

    Each row carries the HTML id :func:`anchor` (``prefix`` tells the tables of one page apart).
    """
    from rynn_teleop.core.params import format_range

    rows = []
    for name, p in schema.params.items():
        kind = f"list of {p.element_type.__name__}" if p.is_list else p.type.__name__
        if p.length is not None:
            kind += f", length {p.length}"
        allowed = []
        if p.min is not None or p.max is not None:
            bounds = format_range(p).removesuffix(f" {p.units}" if p.units else "")
            allowed.append(cell(bounds + (" per element" if p.is_list else "")))
        if p.choices is not None:
            allowed.append("one of " + ", ".join(code(yaml_value(c)) for c in p.choices))
        if getattr(p, "also", ()):  # values accepted besides the type ("auto" for a bool)
            allowed.append("or " + ", ".join(code(yaml_value(v)) for v in p.also))
        default = "**required**" if getattr(p, "required", False) else code(yaml_value(p.default))
        settable = p.dynamic and "runtime-settable" not in p.description
        description = cell(p.description) + (" *(runtime-settable)*" if settable else "")
        rows.append([f'<span id="{anchor(name, prefix)}"></span>{code(name)}', cell(kind), default,
                     cell(p.units), " ; ".join(allowed), description])
    return rows


def renamed_note(schema) -> str:
    """The keys a schema refuses because they were renamed (``ParamSchema.renamed``), as a sentence; or ``""``."""
    renamed = dict(getattr(schema, "renamed", {}) or {})
    if not renamed:
        return ""
    pairs = ", ".join(f"`{old}` → `{new}`" for old, new in renamed.items())
    return f"Renamed keys (a file that still uses the former name is refused, naming the new one): {pairs}.\n"


def anchor(param: str, prefix: str = "p-") -> str:
    """The HTML id of a parameter's row (``#p-<name>`` on a node page, dots and underscores as dashes)."""
    return prefix + param.replace(".", "-").replace("_", "-").lower()


def _bringup_facts(name: str) -> list[tuple[str, str]]:
    from rynn_teleop import bringup

    try:
        spec = bringup.node(name)
    except KeyError:
        return [("Bringup", "not part of the bringup (`rynn-teleop run " + name + "` or `ros2 run`)")]
    started = "always" if spec.switch is None else f"with `{spec.switch}:={spec.started_when}`"
    restart = ("never restarted (hardware: a device error stays visible)" if spec.hardware
               else f"restarted {bringup.RESPAWN_DELAY_S:g} s after it exits (not after a refused start)")
    facts = [("Bringup", f"started {started}; {restart}; demo process `{spec.group}`")]
    if spec.overrides:
        set_by = ", ".join(f"`{key}` by {', '.join(f'`{a}`' for a in args)}" for key, args in spec.overrides.items())
        facts.append(("Set by launch arguments", set_by + " ([launch arguments](../launch.md))"))
    return facts


def node_page(name: str) -> str:
    from rynn_teleop.core.scheduling import PRIORITY_CLASSES
    from rynn_teleop.nodes import REGISTRY, node_class

    cls = node_class(name)
    schema = cls.SCHEMA
    module_name, _, class_name = REGISTRY[name].partition(":")
    module_file = Path(sys.modules[module_name].__file__)
    priority = PRIORITY_CLASSES[getattr(cls, "PRIORITY", "normal")]
    rt = f"SCHED_RR {priority.rr_priority}" if priority.rr_priority is not None else "normal scheduler"
    facts = [
        ("Run", f"`ros2 run rynn_teleop {name}` · `rynn-teleop run {name}`"),
        ("Parameter file", f"`config/{name}.yaml` (`rynn-teleop params {name}` prints it with every key documented)"),
        ("Class", f"`{module_name}.{class_name}`"),
        ("Scheduling class", f"`{priority.name}`: {rt}, else nice {priority.fallback_nice} "
                             f"([scheduling](../../concepts/scheduling.md))"),
        *_bringup_facts(name),
    ]
    out = [f"# {name}\n", f"{inline(node_summary(name))}\n", generated_note(
        f"`{module_name}` (its docstring and `{class_name}.SCHEMA`)"),
        table(["", ""], [[f"**{k}**", v] for k, v in facts])]
    out.append("## Topics, services and behaviour\n")
    out.append(f"The module docstring of `{module_file.relative_to(ROOT / 'src' / 'rynn_teleop')}`:\n")
    out.append(text_block(sys.modules[module_name].__doc__ or "(no docstring)"))
    shared = [base for base in cls.__mro__[1:] if base.__module__.startswith("rynn_teleop.nodes.")
              and base.__module__ not in (module_name, "rynn_teleop.nodes.base")]
    for base in dict.fromkeys(sys.modules[b.__module__] for b in shared):
        out.append(f"Shared with the other nodes built on `{base.__name__}`, its module docstring:\n")
        out.append(text_block(base.__doc__ or ""))
    out.append("All nodes also publish `/diagnostics` (diagnostic_msgs/DiagnosticArray, 1 Hz: rates, latencies, "
               "counters) and serve the standard ROS parameter services.\n")
    out.append("## Parameters\n")
    out.append(f"{len(schema.params)} parameters, validated when the node starts: an unknown key or a value outside "
               "its range stops the node with a message naming the key and what is allowed. Read-only at "
               "runtime unless marked *runtime-settable* (`ros2 param set /" + name + " KEY VALUE`). Dotted names "
               "are nested mappings in the YAML file. Ranges are inclusive.\n")
    out.append(renamed_note(schema))
    out.append(table(["parameter", "type", "default", "units", "allowed", "description"], param_rows(schema)))
    return "\n".join(out)


def nodes_index() -> str:
    from rynn_teleop import bringup
    from rynn_teleop.core.scheduling import PRIORITY_CLASSES
    from rynn_teleop.nodes import node_class

    rows = []
    for name in node_names():
        cls = node_class(name)
        try:
            spec = bringup.node(name)
            group, hardware = f"`{spec.group}`", "yes" if spec.hardware else ""
            started = "always" if spec.switch is None else f"`{spec.switch}:={spec.started_when}`"
        except KeyError:
            group, hardware, started = "", "", "not in the bringup"
        rows.append([f"[`{name}`]({name}.md)", inline(node_summary(name)), f"`config/{name}.yaml`",
                     str(len(cls.SCHEMA.params)), f"`{getattr(cls, 'PRIORITY', 'normal')}`", group, hardware, started])
    classes = [[f"`{c.name}`", str(c.rr_priority) if c.rr_priority is not None else "(normal scheduler)",
                str(c.fallback_nice), f"`{c.placement}`" if c.placement else "not placed"]
               for c in PRIORITY_CLASSES.values()]
    return "\n".join([
        "# Nodes\n",
        "Every node is a console script (`ros2 run rynn_teleop <name>`), reads `config/<name>.yaml`, and can run "
        "with others in one process (`rynn-teleop run`). Each parameter is declared once (type, default, units, "
        "bounds, description: `rynn-teleop params <name>`) and validated at start: a bad value or an unknown key "
        "stops the node with a message naming the key and the allowed range.\n",
        generated_note("`rynn_teleop.nodes.REGISTRY`, each node's module and `rynn_teleop.bringup`"),
        table(["node", "what it does", "parameter file", "parameters", "scheduling class", "demo process",
               "hardware", "started"], rows),
        "## Scheduling classes\n",
        "Each node declares a class (`TeleopNode.PRIORITY`); a process takes the most urgent class of its nodes "
        "(`rynn_teleop.core.scheduling.PRIORITY_CLASSES`, most urgent first). Where real-time scheduling is "
        "refused, a process takes the fallback nice value. See [scheduling](../../concepts/scheduling.md).\n",
        table(["class", "SCHED_RR priority", "fallback nice", "CPU placement"], classes),
    ])


# ---------------------------------------------------------------------- command line
@contextlib.contextmanager
def _help_width() -> Iterator[None]:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _delegates(parser: argparse.ArgumentParser) -> bool:
    """True for a subcommand whose arguments go, unparsed, to a parser of its own (``nargs=REMAINDER``)."""
    return any(a.nargs == argparse.REMAINDER for a in parser._actions)


def delegated_parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """The parsers behind ``cli``'s pass-through subcommands, by their command line (``world-model train``)."""
    from rynn_teleop.cli import TRAINING_TOOLS
    from rynn_teleop.nodes.operator import build_parser as call_parser
    from rynn_teleop.recording.inspect import build_parser as episodes_parser

    def tool(name: str, module_name: str, help_text: str) -> Callable[[], argparse.ArgumentParser]:
        def build() -> argparse.ArgumentParser:  # as cli._cmd_training builds it
            from importlib import import_module

            module = import_module(f"rynn_teleop.world_model.training.{module_name}")
            parser = argparse.ArgumentParser(prog=f"rynn-teleop world-model {name}", description=help_text)
            module.add_arguments(parser)
            return parser
        return build

    out: dict[str, Callable[[], argparse.ArgumentParser]] = {"episodes": episodes_parser, "call": call_parser}
    for name, (module_name, help_text) in TRAINING_TOOLS.items():
        out[f"world-model {name}"] = tool(name, module_name, help_text)
    return out


def cli_commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """(command line, parser) of ``rynn-teleop`` and every subcommand, depth first, delegated ones resolved.

    Raises:
        RuntimeError: a pass-through subcommand this generator does not know the parser of.
    """
    from rynn_teleop.cli import build_parser

    delegated = delegated_parsers()
    found: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(words: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        line = " ".join(words)
        if words and _delegates(parser):
            if line not in delegated:
                raise RuntimeError(f"rynn-teleop {line} passes its arguments to a parser the documentation "
                                   "generator does not know: add it to docs/gen_reference.py delegated_parsers()")
            parser = delegated.pop(line)()
        found.append((line, parser))
        for name, sub in _subcommands(parser).items():
            walk((*words, name), sub)

    walk((), build_parser())
    if delegated:
        raise RuntimeError(f"docs/gen_reference.py knows parsers of commands rynn-teleop no longer has: "
                           f"{', '.join(delegated)}")
    return found


def cli_page() -> str:
    commands = cli_commands()
    out = ["# Command line: `rynn-teleop`\n",
           "One entry point for everything that is not a node: run nodes without launch_ros, the demo, the "
           "robot description, recorded episodes, the operator's actions on a running stack and the world "
           "model's offline tools. Installed into the venv as `.venv/bin/rynn-teleop`.\n",
           generated_note("`rynn_teleop.cli.build_parser()` and the parsers it hands its arguments to"),
           "| command | what it does |", "|---|---|"]
    helps = {}
    for line, parser in commands:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:  # the help each subcommand was added with
                    helps[f"{line} {choice.dest}".strip()] = choice.help or ""
    for line, _ in commands[1:]:
        out.append(f"| [`rynn-teleop {line}`](#{_slug(line)}) | {cell(helps.get(line, ''))} |")
    out.append("")
    with _help_width():
        for line, parser in commands:
            level = "#" * min(2 + line.count(" "), 4) if line else "##"
            out.append(f"{level} rynn-teleop {line} {{#{_slug(line)} }}\n".replace("rynn-teleop  {", "rynn-teleop {"))
            out.append(text_block(parser.format_help()))
    return "\n".join(out)


def _slug(line: str) -> str:
    return "cmd-" + line.replace(" ", "-") if line else "top-level"


# ---------------------------------------------------------------------- launch
def description_launch_arguments() -> list[tuple[str, str, str]]:
    """(name, default, description) of each on/off argument that ``launch/description.launch.py`` declares with a
    literal name (``_switch("sweep", "false", "...")``; read from its syntax tree: the file imports launch_ros)."""
    tree = ast.parse((ROOT / "launch" / "description.launch.py").read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("_switch", "DeclareLaunchArgument")
                and len(node.args) >= 3 and all(isinstance(a, ast.Constant) for a in node.args[:3])):
            out.append(tuple(a.value for a in node.args[:3]))
    return out


def launch_page() -> str:
    from rynn_teleop import bringup

    launch_doc = module_docstring(ROOT / "launch" / "bringup.launch.py")
    args = [[f'<span id="arg-{a.name}"></span>`{a.name}`', code(a.default) or "(empty)",
             ", ".join(code(c) if c else "(empty)" for c in a.choices), cell(a.description)]
            for a in bringup.ARGUMENTS]
    nodes = [[f"[`{s.name}`](nodes/{s.name}.md)", f"`{s.group}`", "yes" if s.hardware else "",
              "always" if s.switch is None else f"`{s.switch}:={s.started_when}`",
              ", ".join(f"`{k}` ({', '.join(v)})" for k, v in s.overrides.items())] for s in bringup.NODES]
    others = [[f"`{o.package}`", f"`{o.executable}`", f"`{o.switch}:=true`", code(" ".join(o.arguments))]
              for o in bringup.OTHER_NODES]
    backends = [[f"`{mode}`", f"`{node}`", ", ".join(f"`{k}: {yaml_value(v)}`" for k, v in values.items())]
                for mode, per_node in bringup.BACKENDS.items() for node, values in per_node.items()]
    lookups = []
    for t in bringup.lookup_tables():
        values = "; ".join(f"{', '.join(r or '(empty)' for r in row)} → `{yaml_value(v)}`"
                           for row, v in t.values.items())
        lookups.append([f"`{t.node}`", f"`{t.key}`", ", ".join(f"`{a}`" for a in t.arguments), cell(values)])
    return "\n".join([
        "# Launch arguments and the bringup table\n",
        generated_note("`rynn_teleop.bringup` (the table `launch/bringup.launch.py`, `rynn-teleop run --mode` and "
                       "the demo all read) and the launch file's docstring"),
        text_block(launch_doc),
        "## Arguments\n",
        "A value outside an argument's choices stops the launch before any node starts, naming the argument. "
        "`rynn-teleop run --mode` takes the same options as flags (`--tracker-backend`, `--record`, ...; see "
        "[the command line](cli.md#cmd-run)).\n",
        table(["argument", "default", "choices", "description"], args),
        "".join(f"Renamed: `{old}:=` is now `{new}:=` (the former name is refused, naming the new one).\n\n"
                for old, new in getattr(bringup, "RENAMED_ARGUMENTS", {}).items()),
        "## This package's nodes, in start order\n",
        f"A node that exits is started again after {bringup.RESPAWN_DELAY_S:g} s, except the hardware nodes and "
        "a node that refused to start (exit code 2). *Demo process*: the process the node shares when the "
        "bringup runs as composed processes (`rynn-teleop demo`).\n",
        table(["node", "demo process", "hardware", "started", "parameters set by arguments"], nodes),
        "## Other packages' nodes\n",
        "Started before this package's; a missing package stops the launch before ours start.\n",
        table(["package", "executable", "started with", "arguments"], others),
        "## Backends of each mode\n",
        "A mode only chooses backends; every other parameter comes from `config/<node>.yaml`.\n",
        table(["mode", "node", "parameters"], backends),
        "## Parameters the launch file sets\n",
        "Each is a table over its arguments' choices, computed from `bringup.mode_overrides` (the launch file "
        "evaluates these tables, so it cannot differ from `rynn-teleop run --mode`).\n",
        table(["node", "parameter", "arguments", "values"], lookups),
        "## `description.launch.py`\n",
        "The robot description alone (no teleoperation): its model, its state and RViz markers.\n",
        text_block(module_docstring(ROOT / "launch" / "description.launch.py")),
        table(["argument", "default", "description"], [[f'<span id="description-arg-{n}"></span>`{n}`', code(d),
                                                         cell(t)] for n, d, t in description_launch_arguments()]),
    ])


# ---------------------------------------------------------------------- world-model run configurations
def run_configs_page() -> str:
    from rynn_teleop.world_model.training.config import DistillConfig, TrainConfig

    out = ["# World-model run configurations\n",
           "`rynn-teleop world-model train CONFIG.yaml` and `rynn-teleop world-model distill CONFIG.yaml` read "
           "one flat YAML file per run; `--set key=value` overrides one key (the value is read as YAML). An "
           "unknown key, a value of the wrong type or out of range names the file, the key and what is allowed. "
           "Examples with every key: `config/world_model_train.yaml`, `config/world_model_distill.yaml`. "
           "Guide: [training the world model](../guides/world-model-training.md).\n",
           generated_note("the declarations of `rynn_teleop.world_model.training.config`")]
    for cls, example in ((TrainConfig, "world_model_train"), (DistillConfig, "world_model_distill")):
        header = ["key", "type", "default", "units", "allowed", "meaning"]
        rows = param_rows(cls.schema(), prefix=f"{cls.command}-")
        note = renamed_note(cls.schema())
        out.append(f"## `{cls.command}`\n")
        out.append(f"{inline(cls.__doc__.strip().splitlines()[0])} Example: `config/{example}.yaml`.\n")
        out.append(note)
        out.append(table(header, rows))
    return "\n".join(out)


# ---------------------------------------------------------------------- bench scripts
def benches_page() -> str:
    out = ["# Bench scripts\n",
           "Speed claims live in `bench/` scripts with a named baseline measured in the same run, never in "
           "timed unit tests. Each script's docstring says how it runs and what it compares against; the "
           "latest figures are on the [benchmarks](../benchmarks/index.md) pages.\n",
           generated_note("the docstrings of `bench/*.py`")]
    for path in sorted((ROOT / "bench").glob("*.py")):
        out.append(f"## `bench/{path.name}`\n")
        out.append(text_block(module_docstring(path) or "(no docstring)"))
    return "\n".join(out)


# ---------------------------------------------------------------------- the pages and the hooks
def reference_pages() -> dict[str, str]:
    """Every generated page: path relative to ``docs/`` -> markdown."""
    pages = {f"{NODES_DIR}/index.md": nodes_index()}
    for name in node_names():
        pages[f"{NODES_DIR}/{name}.md"] = node_page(name)
    pages["reference/cli.md"] = cli_page()
    pages["reference/launch.md"] = launch_page()
    pages["reference/run-configs.md"] = run_configs_page()
    pages["reference/benches.md"] = benches_page()
    return pages


def _find_nodes_section(nav: Any) -> list | None:
    if isinstance(nav, dict):
        nav = list(nav.values())
    if not isinstance(nav, list):
        return None
    if any(item == NODE_NAV_ANCHOR or (isinstance(item, dict) and NODE_NAV_ANCHOR in item.values())
           for item in nav):
        return nav
    for item in nav:
        if isinstance(item, (list, dict)):
            found = _find_nodes_section(item)
            if found is not None:
                return found
    return None


def on_config(config):
    """MkDocs hook: one nav entry per node after the nodes index (the nav follows the registry)."""
    section = _find_nodes_section(config["nav"])
    if section is None:
        raise RuntimeError(f"mkdocs.yml: the nav has no entry {NODE_NAV_ANCHOR!r} to list the nodes after")
    listed = {v for item in section for v in (item.values() if isinstance(item, dict) else [item])}
    section.extend({name: f"{NODES_DIR}/{name}.md"} for name in node_names()
                   if f"{NODES_DIR}/{name}.md" not in listed)
    return config


def on_files(files, config):
    """MkDocs hook: add the generated pages (a hand-written file at the same path is an error)."""
    from mkdocs.structure.files import File

    for path, content in reference_pages().items():
        if files.get_file_from_path(path) is not None:
            raise RuntimeError(f"docs/{path} is generated by docs/gen_reference.py: remove the file")
        files.append(File.generated(config, path, content=content))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the generated reference pages to a folder.")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the pages to (created)")
    args = parser.parse_args(argv)
    for path, content in reference_pages().items():
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
