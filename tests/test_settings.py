"""One declaration of settings: node parameters, run configs and core objects share ``core.params.Param``.

The same declaration gives the same validation and error text (key, value, range; "did you mean" for an
unknown key) wherever a value comes from, and the parameter files, run-config listings and help text are
generated from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import yaml

from rynn_teleop.core.params import REQUIRED, Param, ParamSchema, nonempty
from rynn_teleop.core.settings import Settings, setting
from rynn_teleop.errors import ParameterError


@dataclass(frozen=True)
class Gains(Settings):
    SETTINGS_NAME: ClassVar[str] = "gains"

    folder: str = setting(description="where it goes", type=str, check=nonempty)
    rate: float = setting(10.0, "update rate", units="Hz", min=1.0, max=100.0)
    axes: tuple[float, ...] = setting((1.0, 0.0, 0.0), "an axis", length=3)
    auto_tune: object = setting("auto", "tune online", type=bool, also=("auto",))

    def _problems(self):
        if self.rate > 50.0 and self.auto_tune is True:
            yield "rate", "above 50 Hz the gains cannot be tuned online"


def test_settings_validate_every_declared_field_on_construction():
    g = Gains(folder="out", rate=20, axes=[0, 1, 0])
    assert (g.rate, g.axes, g.auto_tune) == (20.0, (0.0, 1.0, 0.0), "auto")  # coerced; lists stored as tuples
    assert Gains(folder="out", auto_tune=False).auto_tune is False
    cases = [({"rate": 0.5}, "rate", r"gains: parameter 'rate' = 0.5 is out of range \[1.0, 100.0\] Hz"),
             ({"axes": (1.0, 0.0)}, "axes", "has length 2, expected 3"),
             ({"auto_tune": "maybe"}, "auto_tune", "has type str, expected bool or 'auto'"),
             ({"folder": " "}, "folder", "'folder' = ' ' is empty"),
             ({"rate": 60.0, "auto_tune": True}, "rate", "parameter 'rate': above 50 Hz")]
    for changes, key, match in cases:
        with pytest.raises(ParameterError, match=match) as info:
            Gains(**{"folder": "out", **changes})
        assert info.value.key == key


def test_a_declaration_gives_the_same_message_as_a_node_parameter_and_a_run_config_key():
    """One Param, three ways in: the error text is the same (only the owner named before it differs)."""
    from rynn_teleop.world_model.training.config import RunConfigError, TrainConfig

    steps = next(p for p in TrainConfig.params() if p.name == "steps")
    node = ParamSchema("some_node", [steps])
    with pytest.raises(ParameterError) as from_node:
        node.validate({"steps": 0})
    with pytest.raises(RunConfigError) as from_run:
        TrainConfig(dataset="d", base_dir="b", prompt_file="p", output="o", steps=0)
    assert str(from_run.value) == str(from_node.value) == \
        "parameter 'steps' = 0 is out of range [1, 1000000000] steps"


def test_unknown_keys_get_the_same_did_you_mean_everywhere(tmp_path):
    from rynn_teleop.nodes import node_class
    from rynn_teleop.world_model.training.config import RunConfigError, TrainConfig

    with pytest.raises(ParameterError, match=r"unknown parameter 'rate_hx' for node 'tracker'; known: .*; did you "
                                             r"mean 'rate_hz'\?"):
        node_class("tracker").SCHEMA.validate({"rate_hx": 100.0})
    path = tmp_path / "run.yaml"
    path.write_text("dataset: d\nbase_dir: b\nprompt_file: p\noutput: o\nlearnig_rate: 0.1\n")
    with pytest.raises(RunConfigError, match=r"unknown parameter 'learnig_rate' for run config 'train'; known: .*; "
                                             r"did you mean 'learning_rate'\?"):
        TrainConfig.from_file(path)


def test_required_parameters_have_no_default_and_are_listed_commented_out():
    schema = ParamSchema("run", [Param("out", str, REQUIRED, "output folder"), Param("n", int, 3, "count")],
                         what="run config")
    assert schema.defaults() == {"n": 3}
    with pytest.raises(ParameterError, match="parameter 'out' is required for run config 'run'"):
        schema.validate({"n": 4})
    text = schema.to_yaml(ros=False)
    assert "# out:" in text and "(required)" in text and yaml.safe_load(text) == {"n": 3}


def test_run_config_listing_and_help_come_from_the_declarations():
    import argparse

    from rynn_teleop.world_model.training import config, train

    text = config.describe(config.TrainConfig)
    listed = yaml.safe_load(text)
    required = set(config.TrainConfig.required())
    assert required == {"dataset", "base_dir", "prompt_file", "output"}
    assert set(listed) == set(config.TrainConfig.schema().params) - required
    assert config.TrainConfig(**{k: "x" for k in required}, **listed).to_dict() == {
        **{k: "x" for k in required}, **listed}
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    help_text = parser.format_help()
    for param in config.TrainConfig.params():
        assert f"  {param.name}: " in help_text


@pytest.mark.parametrize("name", ["tracker", "hand_retarget", "head_camera", "arm_driver", "hand_driver",
                                  "world_model", "arm_ik", "camera_switch", "recorder", "robot_markers",
                                  "joint_sweep", "robot_description", "console", "foxglove"])
def test_every_parameter_file_is_the_generated_one(name):
    """config/<node>.yaml is what ``rynn-teleop params <node>`` prints (regenerate it after a schema change)."""
    from rynn_teleop.nodes import node_class
    from rynn_teleop.paths import share_dir

    path = share_dir() / "config" / f"{name}.yaml"
    assert path.read_text() == node_class(name).SCHEMA.to_yaml(), \
        f"{path} differs from the schema: rynn-teleop params {name} > config/{name}.yaml"
