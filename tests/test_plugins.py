"""One plug-in pattern for every backend family (``core.plugins``): registration, discovery, node choices.

A throwaway backend per family, defined in a temporary module and registered through the family's
entry-point group (a temporary ``*.dist-info/entry_points.txt`` on ``sys.path``), is selectable by the node's
``backend`` parameter, validated with its own settings and listed in the choices, with no node edited.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rynn_teleop.core.params import Param
from rynn_teleop.core.plugins import Backend, BackendRegistry, BackendSchema, UnknownBackendError
from rynn_teleop.errors import ConfigurationError, ParameterError

# ---------------------------------------------------------------------------------------------- the registry


class Base(Backend):
    pass


def _registry(**kwargs) -> BackendRegistry:
    return BackendRegistry("test_family", "test backend", package=None, base=Base, **kwargs)


def test_register_lookup_and_an_unknown_name_lists_the_known_ones():
    reg = _registry()

    @reg.register
    class Alpha(Base):
        name = "alpha"
        SETTINGS = (Param("gain", float, 1.0, "gain", min=0.0, max=2.0),)

        def __init__(self, gain: float) -> None:
            self.gain = gain

    @reg.register
    class Beta(Base):
        name = "beta"

    assert reg.names() == ("alpha", "beta") and reg.backend("beta") is Beta and "alpha" in reg
    assert [p.name for p in reg.params()] == ["alpha.gain"]
    assert reg.params()[0].describe().startswith("alpha backend: gain")
    with pytest.raises(UnknownBackendError, match=r"'alpah': unknown test backend; known: alpha, beta; did you "
                                                  r"mean 'alpha'\?") as info:
        reg.backend("alpah")
    assert isinstance(info.value, ParameterError) and info.value.known == ("alpha", "beta")
    built = reg.create("alpha", {"alpha.gain": 0.5}, context=None)  # default from_settings: constructor kwargs
    assert isinstance(built, Alpha) and built.gain == 0.5


def test_registration_is_checked():
    reg = _registry()

    class Other(Backend):
        name = "other"

    class Nameless(Base):
        pass

    class Dotted(Base):
        name = "a.b"

    class Unsettled(Base):
        name = "u"
        SETTINGS = ("gain",)

    for cls, match in ((Other, "not a subclass of Base"), (Nameless, "class attribute `name`"),
                       (Dotted, "without dots"), (Unsettled, "SETTINGS")):
        with pytest.raises(ConfigurationError, match=match):
            reg.register(cls)

    @reg.register
    class One(Base):
        name = "one"

    reg.register(One)  # the same class again: nothing changes
    with pytest.raises(ConfigurationError, match="'one' is registered twice"):
        reg.register(type("Two", (Base,), {"name": "one"}))


def test_a_backend_refusing_a_setting_names_the_node_key():
    reg = _registry()

    @reg.register
    class Picky(Base):
        name = "picky"
        SETTINGS = (Param("path", str, "", "a file"),)

        @classmethod
        def from_settings(cls, settings, context):
            raise ParameterError("path", "needs a path")

    with pytest.raises(ParameterError, match="'picky.path': needs a path") as info:
        reg.create("picky", {"picky.path": ""}, None)
    assert info.value.key == "picky.path"


def _package(root: Path, name: str, modules: dict[str, str]) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    for module, text in modules.items():
        (root / name / f"{module}.py").write_text(textwrap.dedent(text))


def test_discovery_imports_every_module_of_the_family_package(tmp_path, monkeypatch):
    """A new module in the family's package is found with nothing else edited."""
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = BackendRegistry("test_scan", "scanned backend", package="scanned_family", base=Base)
    monkeypatch.setattr(sys.modules[__name__], "SCANNED", reg, raising=False)
    registering = f"""
        from {__name__} import SCANNED, Base

        @SCANNED.register
        class B(Base):
            name = "{{}}"
        """
    _package(tmp_path, "scanned_family", {"first": registering.format("first"), "second": registering.format("second"),
                                          "_private": "raise RuntimeError('a private module is not imported')"})
    try:
        assert reg.names() == ("first", "second")
    finally:
        for module in ("scanned_family", "scanned_family.first", "scanned_family.second"):
            sys.modules.pop(module, None)


def _dist_info(root: Path, entry_points: dict[str, dict[str, str]]) -> None:
    info = root / "throwaway_backends-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: throwaway-backends\nVersion: 0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in targets.items()) + "\n"
        for group, targets in entry_points.items()))


def test_entry_points_register_classes_and_modules_and_a_broken_one_is_named(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ep_backends.py").write_text(textwrap.dedent(f"""
        from {__name__} import Base

        class ByClass(Base):
            name = "by_class"
        """))
    _dist_info(tmp_path, {"rynn_teleop.test_ep": {"by_class": "ep_backends:ByClass"},
                          "rynn_teleop.test_ep_broken": {"broken": "no_such_module_here:Nothing"},
                          "rynn_teleop.test_ep_misnamed": {"other": "ep_backends:ByClass"}})
    importlib.invalidate_caches()
    try:
        reg = BackendRegistry("test_ep", "ep backend", package=None, base=Base)
        assert reg.names() == ("by_class",)
        with pytest.raises(ConfigurationError, match="'broken' .*rynn_teleop.test_ep_broken.* cannot be loaded"):
            BackendRegistry("test_ep_broken", "ep backend", package=None, base=Base).names()
        with pytest.raises(ConfigurationError, match="named as its backend"):
            BackendRegistry("test_ep_misnamed", "ep backend", package=None, base=Base).names()
    finally:
        sys.modules.pop("ep_backends", None)


def test_schema_choices_and_settings_follow_the_registry():
    reg = _registry()

    @reg.register
    class Alpha(Base):
        name = "alpha"

    schema = BackendSchema("node", [Param("rate_hz", float, 10.0, "rate", "Hz", min=1.0, max=100.0)], backends=reg,
                           default="alpha", description="the backend", renamed={"source": "backend"})
    assert list(schema.params) == ["backend", "rate_hz"] and schema.params["backend"].choices == ("alpha",)

    @reg.register
    class Beta(Base):
        name = "beta"
        SETTINGS = (Param("gain", float, 1.0, "gain", min=0.0, max=2.0),)

    assert list(schema.params) == ["backend", "rate_hz", "beta.gain"]
    assert schema.params["backend"].choices == ("alpha", "beta")
    assert schema.validate({"backend": "beta", "beta.gain": 2.0})["beta.gain"] == 2.0
    with pytest.raises(UnknownBackendError, match="known: alpha, beta"):
        schema.validate({"backend": "gamma"})
    with pytest.raises(ParameterError, match="'source' of node 'node' was renamed 'backend'"):
        schema.validate({"source": "alpha"})


# ---------------------------------------------------------------------------------------------- every family

THROWAWAY = '''
"""Throwaway backends of every family, registered through entry points only (tests/test_plugins.py)."""

import numpy as np

from rynn_teleop.core.arm_teleop import DEFAULT_HOME
from rynn_teleop.core.params import Param
from rynn_teleop.hardware.sim import SimArms, SimHands
from rynn_teleop.policies import PolicyRunner
from rynn_teleop.sources.camera import SyntheticScene
from rynn_teleop.sources.hands import SyntheticGlove
from rynn_teleop.sources.trackers import SyntheticOperator
from rynn_teleop.world_model.render import RenderGenerator

GAIN = (Param("gain", float, 1.0, "a throwaway setting", "-", min=0.0, max=2.0),)


class Tracker(SyntheticOperator):
    name, SETTINGS = "throwaway", GAIN

    @classmethod
    def from_settings(cls, settings, context):
        out = cls(serials=context.serials, rate_hz=context.rate_hz, hold_s=0.0)
        out.gain = settings["gain"]
        return out


class Hands(SyntheticGlove):
    name, SETTINGS = "throwaway", GAIN

    @classmethod
    def from_settings(cls, settings, context):
        out = cls(sides=context.sides, rate_hz=context.rate_hz)
        out.gain = settings["gain"]
        return out


class Camera(SyntheticScene):
    name, SETTINGS = "throwaway", GAIN

    @classmethod
    def from_settings(cls, settings, context):
        out = cls(width=64, height=48, fps=30.0, robot_model=context.robot())
        out.gain = settings["gain"]
        return out


class Arms(SimArms):
    name, SETTINGS = "throwaway", GAIN

    @classmethod
    def from_settings(cls, settings, context):
        out = cls(context.joint_names, context.limits, np.array(DEFAULT_HOME))
        out.gain = settings["gain"]
        return out


class HandJoints(SimHands):
    name, SETTINGS = "throwaway", GAIN

    @classmethod
    def from_settings(cls, settings, context):
        out = cls(context.joint_names, context.limits, np.zeros(len(context.joint_names)))
        out.gain = settings["gain"]
        return out


class WorldModel(RenderGenerator):
    name, SETTINGS = "throwaway", GAIN

    @classmethod
    def from_settings(cls, settings, context):
        out = cls(context.robot, context.intrinsics)
        out.gain = settings["gain"]
        return out


class Policy(PolicyRunner):
    name, SETTINGS = "throwaway", GAIN

    def __init__(self, gain):
        self.gain = gain

    def reset(self):
        pass

    def act(self, observation):
        return np.zeros(54)
'''

#: family (the node choosing it) -> (entry-point class, its registry, the node attribute holding the built
#: backend)
FAMILIES = {
    "tracker": ("Tracker", "rynn_teleop.sources.trackers:TRACKER_BACKENDS", "source"),
    "hand_retarget": ("Hands", "rynn_teleop.sources.hands:HAND_BACKENDS", "source"),
    "head_camera": ("Camera", "rynn_teleop.sources.camera:CAMERA_BACKENDS", "source"),
    "arm_driver": ("Arms", "rynn_teleop.hardware.base:ARM_BACKENDS", "backend"),
    "hand_driver": ("HandJoints", "rynn_teleop.hardware.base:HAND_BACKENDS", "backend"),
    "world_model": ("WorldModel", "rynn_teleop.world_model.generator:WORLD_MODEL_BACKENDS", "generator"),
    "policy": ("Policy", "rynn_teleop.policies:POLICY_BACKENDS", None),
}


def _registry_of(family: str) -> BackendRegistry:
    module, _, attr = FAMILIES[family][1].partition(":")
    return getattr(importlib.import_module(module), attr)


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """The throwaway backend of every family, registered by entry points (removed afterwards)."""
    (tmp_path / "throwaway_backends.py").write_text(THROWAWAY)
    _dist_info(tmp_path, {f"rynn_teleop.{family}": {"throwaway": f"throwaway_backends:{cls}"}
                          for family, (cls, _, _) in FAMILIES.items()})
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    registries = {family: _registry_of(family) for family in FAMILIES}
    try:
        for reg in registries.values():
            reg.discover(again=True)
        yield registries
    finally:
        for reg in registries.values():
            reg.unregister("throwaway")
        sys.modules.pop("throwaway_backends", None)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_throwaway_backend_is_listed_with_its_settings_and_validated(throwaway, family):
    reg = throwaway[family]
    assert "throwaway" in reg.names()
    assert [p.name for p in reg.params() if p.name.startswith("throwaway.")] == ["throwaway.gain"]
    if family == "policy":  # no node runs a policy yet: built by the registry
        assert reg.create("throwaway", {"throwaway.gain": 0.5}, None).gain == 0.5
        return
    from rynn_teleop.nodes import node_class

    schema = node_class(family).SCHEMA
    assert "throwaway" in schema.params["backend"].choices
    assert schema.params["throwaway.gain"].max == 2.0
    assert schema.validate({"backend": "throwaway", "throwaway.gain": 0.5})["throwaway.gain"] == 0.5
    with pytest.raises(ParameterError, match=r"'throwaway.gain' = 3.0 is out of range \[0.0, 2.0\]") as info:
        schema.validate({"backend": "throwaway", "throwaway.gain": 3.0})
    assert info.value.key == "throwaway.gain"
    with pytest.raises(ParameterError, match="'throwaway.gain' = 'high' has type str, expected float"):
        schema.validate({"throwaway.gain": "high"})
    assert "throwaway:" in schema.to_yaml()  # its block in the generated parameter file


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"policy"}))
def test_a_throwaway_backend_is_selected_by_the_node_parameter(throwaway, family, ros_domain_id):
    from rynn_teleop.runner import Composition

    cls_name, _, attribute = FAMILIES[family]
    comp = Composition([family], overrides={family: {"backend": "throwaway", "throwaway.gain": 0.25}},
                       domain_id=ros_domain_id)
    try:
        built = getattr(comp.node(family), attribute)
        assert type(built).__name__ == cls_name and built.gain == 0.25
        assert comp.node(family).params["backend"] == "throwaway"
    finally:
        comp.shutdown()
    assert not comp.errors


# ---------------------------------------------------------------------------------------------- the named errors


@pytest.mark.parametrize(("node", "values", "error", "match"), [
    # an unknown backend name lists the registered ones
    ("arm_driver", {"backend": "ur5"}, UnknownBackendError, r"'backend' = 'ur5': unknown arm_driver backend; known: "
                                                             r"kinematic, marvin, sim"),
    ("tracker", {"backend": "synthtic"}, UnknownBackendError, r"did you mean 'synthetic'\?"),
    ("world_model", {"backend": "cosmos"}, UnknownBackendError, "known: diffusion, render"),
    # a setting of another backend is validated too (one parameter file holds every backend's settings)
    ("arm_driver", {"backend": "sim", "marvin.vel_ratio": 300.0}, ParameterError,
     r"'marvin.vel_ratio' = 300.0 is out of range \[1.0, 100.0\] %"),
    ("arm_driver", {"backend": "sim", "marvin.ip": "192.168.1"}, ParameterError, "is not an IPv4 address"),
    ("world_model", {"diffusion.device": "tpu"}, ParameterError, "'diffusion.device' = 'tpu' is not cpu, cuda"),
    # a key of no backend is an unknown parameter
    ("arm_driver", {"ur5.ip": "10.0.0.1"}, ParameterError, "unknown parameter 'ur5.ip' for node 'arm_driver'"),
    ("hand_driver", {"kinematic.initial_position": [0.0] * 14}, ParameterError,
     "unknown parameter 'kinematic.initial_position'"),
    # a wrong type
    ("hand_driver", {"kinematic.latency_s": "fast"}, ParameterError,
     "'kinematic.latency_s' = 'fast' has type str, expected float"),
    ("tracker", {"synthetic.dropouts": ["left_wrist:5:4"]}, ParameterError, "each must be 'role:start_s:end_s'"),
    # the former name of the choice
    ("head_camera", {"source": "replay"}, ParameterError, "'source' of node 'head_camera' was renamed 'backend'"),
])
def test_bad_backend_parameters_are_named_errors(node, values, error, match):
    from rynn_teleop.nodes import node_class

    with pytest.raises(error, match=match):
        node_class(node).SCHEMA.validate(values)


def test_a_setting_of_another_backend_is_accepted_when_valid():
    from rynn_teleop.nodes import node_class

    values = node_class("arm_driver").SCHEMA.validate({"backend": "sim", "marvin.ip": "10.0.0.2"})
    assert values["marvin.ip"] == "10.0.0.2" and values["backend"] == "sim"


# ---------------------------------------------------------------------------------------------- registration is cheap


def test_registration_and_the_render_backend_never_import_torch():
    """Every family's modules are imported (discovery) and the render backend is built by the world_model
    node's schema, in a fresh interpreter: torch stays unimported (the diffusion backend imports it when
    built)."""
    code = textwrap.dedent("""
        import sys
        from rynn_teleop.core.camera import default_intrinsics
        from rynn_teleop.core.robot_model import RobotModel
        from rynn_teleop.hardware.base import ARM_BACKENDS, HAND_BACKENDS
        from rynn_teleop.nodes.world_model import WorldModelNode
        from rynn_teleop.policies import POLICY_BACKENDS
        from rynn_teleop.sources.camera import CAMERA_BACKENDS
        from rynn_teleop.sources.hands import HAND_BACKENDS as HANDS
        from rynn_teleop.sources.trackers import TRACKER_BACKENDS
        from rynn_teleop.world_model.generator import WorldModelContext

        for reg in (ARM_BACKENDS, HAND_BACKENDS, POLICY_BACKENDS, CAMERA_BACKENDS, HANDS, TRACKER_BACKENDS):
            reg.names()
        schema = WorldModelNode.SCHEMA
        assert "diffusion" in schema.params["backend"].choices and "diffusion.preset" in schema.params
        values = schema.validate({"backend": "render"})
        generator = schema.create(values, WorldModelContext(RobotModel.default(), default_intrinsics(64, 48)))
        print(type(generator).__name__, "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["RenderGenerator", "False"]
