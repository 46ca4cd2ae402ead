"""config/*.yaml, the node registry and setup.py stay in step (the docs: tests/test_docs.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from rynn_teleop.nodes import REGISTRY, node_class
from rynn_teleop.paths import share_dir

ROOT = Path(__file__).resolve().parents[1]


def _flatten(params: dict, prefix: str = "") -> dict:
    """Nested YAML mappings -> dotted parameter names, as ROS reads them."""
    out = {}
    for key, value in params.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_config_file_declares_exactly_the_schema(name):
    schema = node_class(name).SCHEMA
    assert schema.node_name == name
    path = share_dir() / "config" / f"{name}.yaml"
    values = schema.load_yaml(path)  # raises on unknown keys or bad values
    text = path.read_text()
    raw = _flatten(yaml.safe_load(text)[name]["ros__parameters"])
    # an empty-list default cannot be typed in a ROS parameter file: it is listed commented out
    empty = {k for k, p in schema.params.items() if p.is_list and not p.default}
    assert set(raw) == set(schema.params) - empty, f"{path} must list every parameter of {name}"
    for key in empty:
        assert f"# {key.rsplit('.', 1)[-1]}: []" in text, f"{path} must show {key} (commented out)"
    assert set(values) == set(schema.params)


#: run configs of the world-model tools (``rynn-teleop world-model train|distill CONFIG``), not node parameters
RUN_CONFIGS = {"world_model_train": "TrainConfig", "world_model_distill": "DistillConfig"}


def test_every_config_file_belongs_to_a_node():
    for path in (share_dir() / "config").glob("*.yaml"):
        assert path.stem in REGISTRY or path.stem in RUN_CONFIGS, \
            f"{path.name} has no node in rynn_teleop.nodes.REGISTRY"


@pytest.mark.parametrize("name", sorted(RUN_CONFIGS))
def test_run_configs_list_every_key_and_load(name):
    from rynn_teleop.world_model.training import config

    cls = getattr(config, RUN_CONFIGS[name])
    path = share_dir() / "config" / f"{name}.yaml"
    cls.from_file(path)  # raises on unknown keys or bad values
    assert set(yaml.safe_load(path.read_text())) == set(cls.schema().params), f"{path} must list every key of {name}"


def test_console_scripts_match_registry():
    tree = ast.parse((ROOT / "src" / "rynn_teleop" / "setup.py").read_text())
    nodes = next(
        ast.literal_eval(n.value) for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "NODES"
    )
    assert set(nodes) == set(REGISTRY)
    for name, target in nodes.items():
        module = target.split(":")[0]
        assert REGISTRY[name].startswith(module + ":"), name

