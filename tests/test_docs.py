"""The documentation site: its generated reference covers the code, and the README stays a short entry point.

``docs/gen_reference.py`` (an MkDocs hook) generates the reference pages from the code at every build;
``scripts/test.sh`` builds the site with ``mkdocs build --strict`` (broken links and anchors, pages outside the
navigation). These tests check what a build cannot: that every node, parameter, command, launch argument and
run-config key declared in the code appears in the generated pages.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from rynn_teleop import bringup
from rynn_teleop.core.params import format_range
from rynn_teleop.nodes import REGISTRY, node_class

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_MAX_LINES = 150


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen():
    return _generator()


@pytest.fixture(scope="module")
def pages(gen):
    return gen.reference_pages()


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_parameter_is_on_its_node_page(pages, gen, name):
    page = pages[f"reference/nodes/{name}.md"]
    schema = node_class(name).SCHEMA
    assert f"`config/{name}.yaml`" in page and f"rynn-teleop params {name}" in page
    rows = {line.split("</span>", 1)[1].split(" | ")[0]: line for line in page.splitlines()
            if line.startswith('| <span id="p-')}
    assert set(rows) == {f"`{key}`" for key in schema.params}, f"{name}: the page's rows are not the schema's"
    for key, param in schema.params.items():
        row = rows[f"`{key}`"]
        assert f'id="{gen.anchor(key)}"' in row
        default = "**required**" if getattr(param, "required", False) else gen.code(gen.yaml_value(param.default))
        assert default in row, f"{name}.{key}: default"
        assert gen.cell(param.description) in row, f"{name}.{key}: description"
        if param.units:
            assert f"| {gen.cell(param.units)} |" in row, f"{name}.{key}: units"
        if param.min is not None or param.max is not None:
            assert format_range(param).removesuffix(f" {param.units}").strip() in row, f"{name}.{key}: range"
        for choice in param.choices or ():
            assert gen.code(gen.yaml_value(choice)) in row, f"{name}.{key}: choice {choice!r}"


def test_every_node_is_in_the_index_and_the_nav(pages, gen):
    index = pages["reference/nodes/index.md"]
    for name in REGISTRY:
        assert f"[`{name}`]({name}.md)" in index and f"`config/{name}.yaml`" in index
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    gen.on_config(config)
    section = gen._find_nodes_section(config["nav"])
    listed = [v for item in section for v in (item.values() if isinstance(item, dict) else [item])]
    assert listed == [gen.NODE_NAV_ANCHOR, *(f"reference/nodes/{name}.md" for name in REGISTRY)]


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[str]:
    """Every subcommand line of ``parser`` (depth first), as argparse itself lists them."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append(" ".join((*words, name)))
                out += _commands(sub, (*words, name))
    return out


def test_every_cli_command_is_on_the_command_line_page(pages, gen):
    from rynn_teleop.cli import TRAINING_TOOLS, build_parser

    page = pages["reference/cli.md"]
    documented = [line for line, _ in gen.cli_commands()]
    own = _commands(build_parser())
    assert set(own) <= set(documented)
    for tool in TRAINING_TOOLS:
        assert f"world-model {tool}" in documented
    for line in documented[1:]:  # [0]: rynn-teleop itself
        heading = re.search(rf"^#+ rynn-teleop {re.escape(line)} {{#", page, flags=re.M)
        assert heading, f"no section for rynn-teleop {line}"
    for line, parser in gen.cli_commands():  # every option of every parser is shown in its help
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in page, f"rynn-teleop {line}: {flag}"


def test_every_launch_argument_is_on_the_launch_page(pages):
    page = pages["reference/launch.md"]
    for arg in bringup.ARGUMENTS:
        row = next(line for line in page.splitlines() if line.startswith(f'| <span id="arg-{arg.name}">'))
        assert (f"`{arg.default}`" if arg.default else "(empty)") in row
        for choice in arg.choices:
            assert (f"`{choice}`" if choice else "(empty)") in row
    for spec in bringup.NODES:
        assert f"[`{spec.name}`](nodes/{spec.name}.md)" in page


def test_every_run_config_key_is_on_its_page(pages, gen):
    from rynn_teleop.world_model.training.config import DistillConfig, TrainConfig

    page = pages["reference/run-configs.md"]
    for cls in (TrainConfig, DistillConfig):
        section = page.split(f"## `{cls.command}`", 1)[1].split("\n## ", 1)[0]
        keys = [p.name for p in cls.params()]
        assert keys
        for key in keys:
            assert f'id="{gen.anchor(key, cls.command + "-")}"></span>`{key}`' in section, f"{cls.command}: {key}"


def test_every_bench_script_is_on_the_bench_page(pages):
    page = pages["reference/benches.md"]
    for path in (ROOT / "bench").glob("*.py"):
        assert f"## `bench/{path.name}`" in page


def test_generated_pages_are_not_files_in_the_repository(pages):
    for path in pages:
        assert not (DOCS / path).exists(), f"docs/{path} is generated at build time: remove the file"


def test_architecture_overview_is_generated_from_the_io_declarations(gen):
    """The node overview of concepts/architecture.md is generated (no hand-written table): every node, its parameter
    file and the default names of what it publishes, subscribes to and serves."""
    from rynn_teleop.nodes.io import node_io

    text = (DOCS / "concepts" / "architecture.md").read_text()
    section = text.split("## Nodes and topics at a glance", 1)[1].split("\n## ", 1)[0]
    assert gen.IO_OVERVIEW_MARKER in section
    assert not re.search(r"^\| `[a-z_]+` \|", section, flags=re.M), "a hand-written node table"
    rendered = gen.on_page_markdown(text, None, None, None)
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| \[`([a-z_]+)`\]\(.*$", rendered, flags=re.M)}
    assert set(rows) == set(REGISTRY)
    for name in REGISTRY:
        cls = node_class(name)
        assert f"`config/{name}.yaml`" in rows[name]
        resolved = node_io(cls, cls.SCHEMA.defaults(), {f: "" for f in cls.IO.facts}, base=False)
        for kind in ("publishers", "subscriptions", "services"):
            for endpoint in resolved[kind]:
                assert f"`{endpoint.name}`" in rows[name], f"{name}: {kind[:-1]} {endpoint.name}"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_declared_topic_and_service_is_on_its_node_page(pages, name):
    from rynn_teleop.core.node_io import KINDS

    page = pages[f"reference/nodes/{name}.md"]
    section = page.split("## Topics and services", 1)[1].split("\n## ", 1)[0]
    for kind in KINDS:
        for entry in node_class(name).IO.entries(kind):
            row = next((line for line in section.splitlines() if line.startswith(f"| `{entry.name}`")), None)
            assert row is not None, f"{name}: {kind[:-1]} {entry.name}"
            assert entry.type in row or entry.type == "*"


def test_readme_fits_on_a_screen_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    for must in ("./scripts/demo.sh", "./scripts/test.sh", "rynn-teleop docs", "colcon build"):
        assert must in text
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        if not link.startswith(("http://", "https://")):
            assert (ROOT / link).exists(), f"README links to {link}, which does not exist"


# ---------------------------------------------------------------------- hand-written pages name what exists
def _hand_written() -> dict[str, str]:
    """README.md and every markdown file under docs/ (the generated pages are not files)."""
    pages = {"README.md": (ROOT / "README.md").read_text()}
    for path in sorted(DOCS.rglob("*.md")):
        pages[str(path.relative_to(ROOT))] = path.read_text()
    return pages


def _code(text: str) -> list[str]:
    """The code of ``text``: each line of its fenced and indented blocks, each inline span (line breaks joined)."""
    out, prose, fence = [], [], None
    for line in text.splitlines():
        marker = re.match(r"\s*(`{3,}|~{3,})", line)
        if fence is None and marker:
            fence = marker.group(1)
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            else:
                out.append(line)
        elif line.startswith("    ") and not line.lstrip().startswith(("-", "|")):
            out.append(line)
        else:
            prose.append(line)
    out += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", "\n".join(prose))]
    return out


def test_launch_arguments_named_in_the_docs_exist(gen):
    known = {a.name for a in bringup.ARGUMENTS} | {n for n, _, _ in gen.description_launch_arguments()}
    for page, text in _hand_written().items():
        for name in re.findall(r"\b([a-z_]+):=", text):
            assert name in known, f"{page} names the launch argument {name}:=, which no launch file declares"


def test_commands_and_options_named_in_the_docs_exist(gen):
    """Every ``rynn-teleop WORDS --option`` in a page's code is a command with that option."""
    parsers = dict(gen.cli_commands())
    for page, text in _hand_written().items():
        for code in _code(text):
            for match in re.finditer(r"rynn-teleop((?:\s+[a-z][a-z-]*)*)([^|;&#]*)", code):
                words = match.group(1).split()
                while words and " ".join(words) not in parsers:
                    words.pop()
                line = " ".join(words)
                options = {o for a in parsers[line]._actions for o in a.option_strings}
                for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", match.group(2)):
                    assert flag in options, f"{page}: `rynn-teleop {line}` has no option {flag} ({code.strip()})"


def test_nodes_named_in_ros2_run_exist():
    for page, text in _hand_written().items():
        for name in re.findall(r"ros2 run rynn_teleop ([a-z_]+)", text):
            assert name in REGISTRY, f"{page}: ros2 run rynn_teleop {name}: no such node"
