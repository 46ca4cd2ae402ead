"""Task scenes of the physical twin: the shipped files, seeded layouts, and named errors for bad files."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.sim.scene import Footprint, SceneError, available_scenes, load_scene

SHIPPED = ("pick_place", "bimanual_lift")


def test_the_shipped_scenes_are_listed_and_load() -> None:
    assert set(SHIPPED) <= set(available_scenes())
    pick = load_scene("pick_place")
    assert [o.name for o in pick.objects] == ["red_cube", "green_cylinder", "yellow_ball"]  # the demo's objects
    assert pick.task.object == "red_cube" and pick.task.target == "goal"
    lift = load_scene("bimanual_lift")
    assert lift.target("shelf").support == "platform" and lift.object("platform").fixed


@pytest.mark.parametrize("name", SHIPPED)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_a_layout_is_a_function_of_the_seed_and_keeps_every_declaration(name: str, seed: int) -> None:
    scene = load_scene(name)
    layout = scene.layout(seed)
    again = scene.layout(seed)
    prints = []
    for obj in scene.objects:
        pose = layout.objects[obj.name]
        assert np.array_equal(pose.position, again.objects[obj.name].position)
        x, y, z = pose.position
        assert obj.x.lo <= x <= obj.x.hi and obj.y.lo <= y <= obj.y.hi
        assert z == pytest.approx(scene.table.height + obj.height / 2)
        yaw = 2 * math.atan2(pose.quaternion[2], pose.quaternion[3])
        assert obj.yaw.lo - 1e-9 <= yaw <= obj.yaw.hi + 1e-9
        assert scene.table.contains(x, y, obj.extent)
        half = np.array(obj.size[:2]) / 2 if obj.shape == "box" else np.full(2, obj.size[0])
        prints.append(Footprint(np.array([x, y]), half, yaw))
    for i, a in enumerate(prints):  # footprints keep the scene's clearance from each other
        assert not any(a.overlaps(b, scene.clearance - 1e-9) for b in prints[i + 1:])
    for target in scene.targets:
        region = layout.targets[target.name]
        assert np.array_equal(region.center, again.targets[target.name].center)
        if target.support == "table":
            assert region.center[2] == scene.table.height
        else:  # on its support's top, centred on it
            support = layout.objects[target.support].position
            assert region.center[2] == pytest.approx(support[2] + scene.object(target.support).height / 2)


def _inside(fp: Footprint, pts: np.ndarray) -> np.ndarray:
    local = (pts - fp.center) @ fp.axes().T
    return np.all(np.abs(local) <= fp.half + 1e-9, axis=1)


def _samples(fp: Footprint) -> np.ndarray:
    u, v = np.meshgrid(np.linspace(-1, 1, 41), np.linspace(-1, 1, 41))
    return fp.center + np.stack([u.ravel() * fp.half[0], v.ravel() * fp.half[1]], axis=1) @ fp.axes()


def _touch(a: Footprint, b: Footprint) -> bool:
    """Brute force: a sampled point of one rectangle lies in the other."""
    return bool(_inside(a, _samples(b)).any() or _inside(b, _samples(a)).any())


@settings(max_examples=200, deadline=None)
@given(st.floats(-0.6, 0.6), st.floats(-0.6, 0.6), st.floats(-math.pi, math.pi), st.floats(-math.pi, math.pi),
       st.floats(0.01, 0.3), st.floats(0.01, 0.3))
def test_footprints_overlap_as_a_brute_force_check_says(x: float, y: float, yaw_a: float, yaw_b: float,
                                                        hx: float, hy: float) -> None:
    """Separating axes against sampled points (up to the sampling step, 4 cm of growth)."""
    a = Footprint(np.zeros(2), np.array([0.2, 0.05]), yaw_a)
    b = Footprint(np.array([x, y]), np.array([hx, hy]), yaw_b)
    if _touch(a, b):
        assert a.overlaps(b)
    if a.overlaps(b):
        assert _touch(a, Footprint(b.center, b.half + 0.04, b.yaw))
    assert a.overlaps(b, 0.05) == b.overlaps(a, 0.05)


def _good() -> dict:
    return yaml.safe_load(open(load_scene("pick_place").path, encoding="utf-8"))


def _write(tmp_path, data) -> str:
    path = tmp_path / "scene.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(path)


@pytest.mark.parametrize("change, key, words", [
    (lambda d: d["objects"][0].update(colur=[1, 0, 0]), "objects[0].colur", "unknown key"),
    (lambda d: d.update(gravity=9.81), "gravity", "unknown key"),
    (lambda d: d["table"].update(legs=4), "table.legs", "unknown key"),
    (lambda d: d["objects"][0].update(mass=-0.1), "objects[0].mass", "> 0"),
    (lambda d: d["objects"][1].update(mass=0), "objects[1].mass", "> 0"),
    (lambda d: d["objects"][0].update(x=[0.9, 1.2]), "objects[0]", "outside the table"),
    (lambda d: d["objects"][2].update(y=[0.5, 0.7]), "objects[2]", "outside the table"),
    (lambda d: d["targets"][0].update(x=[-0.2, 0.3]), "targets[0]", "outside the table"),
    (lambda d: d["objects"][0].update(shape="cone"), "objects[0].shape", "unknown shape"),
    (lambda d: d["objects"][0].update(size=[0.05, 0.05]), "objects[0].size", "list of 3"),
    (lambda d: d["objects"][0].update(x=[0.5, 0.45]), "objects[0].x", "reversed"),
    (lambda d: d["objects"][0].update(friction="high"), "objects[0].friction", "finite number"),
    (lambda d: d["objects"][0].update(colour=[2, 0, 0]), "objects[0].colour", "[0, 1]"),
    (lambda d: d["objects"][0].pop("mass"), "objects[0].mass", "missing"),
    (lambda d: d["objects"][1].update(name="red_cube"), "objects", "used twice"),
    (lambda d: d["task"].update(object="blue_plate"), "task.object", "not a movable object"),
    (lambda d: d["task"].update(kind="stack"), "task.kind", "unknown task kind"),
    (lambda d: d["targets"][0].update(support="shelf"), "targets[0].support", "neither 'table' nor a fixed"),
    (lambda d: d.update(objects=[]), "objects", "non-empty list"),
])
def test_a_bad_scene_file_is_a_named_error(tmp_path, change, key: str, words: str) -> None:
    data = _good()
    change(data)
    with pytest.raises(SceneError) as err:
        load_scene(_write(tmp_path, data))
    assert err.value.key == key and words in str(err.value) and "scene.yaml" in str(err.value)
    assert isinstance(err.value, ConfigurationError)


def test_unreadable_scene_files_are_named_errors(tmp_path) -> None:
    with pytest.raises(SceneError, match="not found"):
        load_scene(tmp_path / "missing.yaml")
    with pytest.raises(SceneError, match="line 2"):
        load_scene(_write(tmp_path, "name: x\n  table: [\n"))
    with pytest.raises(SceneError, match="mapping"):
        load_scene(_write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(SceneError, match="unknown key True"):  # YAML 1.1 reads a bare `on:` key as true
        data = _good()
        data["targets"][0][True] = "table"
        load_scene(_write(tmp_path, data))


def test_an_impossible_layout_says_which_object(tmp_path) -> None:
    data = _good()
    data["objects"][1].update(x=data["objects"][0]["x"], y=data["objects"][0]["y"])  # same small spot
    data["objects"][0].update(x=[0.5, 0.5], y=[-0.37, -0.37])
    data["objects"][1].update(x=[0.5, 0.5], y=[-0.37, -0.37])
    scene = load_scene(_write(tmp_path, data))
    with pytest.raises(ConfigurationError, match="green_cylinder"):
        scene.layout(0)
