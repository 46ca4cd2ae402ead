"""The twin's objects for the world model (world_model.training.objects) and the region metrics the evaluation
scores them with (world_model.training.metrics): projected boxes with known answers, moved / lifted flags on
hand-made poses, clip files that carry objects, box PSNR/SSIM and patch location on hand-made frames, and a
scripted twin episode whose boxes hold what the synthetic head camera draws of each object."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twin_episodes import scripted_twin_episode, scripted_twin_run

from rynn_teleop.core.camera import CameraIntrinsics, default_intrinsics
from rynn_teleop.core.camera_view import CameraView
from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.world_model.training import metrics
from rynn_teleop.world_model.training import objects as ob
from rynn_teleop.world_model.training.clips import Clip, DatasetError, read_clip, write_clip

W, H = 96, 64  # [px] the tiny preset's frame size
K = CameraIntrinsics(W, H, 100.0, 100.0, 47.5, 31.5)  # principal point at the image's centre
# the optical frame looking along base_link's x: optical z = base x, optical x = -base y, optical y = -base z
T_LOOK_X = np.array([[0.0, 0.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
UPRIGHT = (0.0, 0.0, 0.0, 1.0)  # quaternion x, y, z, w
CUBE = ob.SceneObject("cube", "box", (0.2, 0.2, 0.2), False)


def _pose(x: float, y: float = 0.0, z: float = 0.0, q=UPRIGHT) -> np.ndarray:
    return np.array([x, y, z, *q], dtype=float)


def _yaw(angle: float) -> tuple[float, float, float, float]:
    return (0.0, 0.0, math.sin(angle / 2), math.cos(angle / 2))


def _covering(lo: float, hi: float, size: int) -> tuple[int, int]:
    """Pixels (half-open) whose squares [i - 0.5, i + 0.5) meet [lo, hi], clipped to [0, size]: by enumeration."""
    hit = [i for i in range(size) if i + 0.5 > lo and i - 0.5 <= hi]
    return (hit[0], hit[-1] + 1) if hit else (0, 0)


# ---- boxes ---------------------------------------------------------------------------------------------------


def test_a_cube_straight_ahead_has_the_pinhole_box():
    view = CameraView(K, T_LOOK_X)
    box = ob.project_boxes(view, [CUBE], _pose(1.0)[None, None])[0, 0]
    # the near face (depth 0.9 m) spans +-0.1 m: u, v = c +- f * 0.1 / 0.9
    half = 100.0 * 0.1 / 0.9
    (u0, u1), (v0, v1) = _covering(47.5 - half, 47.5 + half, W), _covering(31.5 - half, 31.5 + half, H)
    assert tuple(box) == (u0, v0, u1, v1) == (36, 20, 60, 44)  # 36.39 .. 58.61 px, 20.39 .. 42.61 px


@given(dy=st.floats(-0.4, 0.4), dz=st.floats(-0.3, 0.3), depth=st.floats(0.5, 3.0), yaw=st.floats(-3.2, 3.2))
@settings(max_examples=60, deadline=None)
def test_a_box_holds_every_projected_surface_point_and_is_tight(dy, dz, depth, yaw):
    view = CameraView(K, T_LOOK_X)
    pose = _pose(depth, dy, dz, _yaw(yaw))
    box = ob.project_boxes(view, [CUBE], pose[None, None])[0, 0]
    corners = CUBE.hull_points() @ ob.quaternion_matrices(np.array(pose[3:])).T + pose[:3]
    uv = view.project(corners).uv
    u0, u1 = _covering(uv[:, 0].min(), uv[:, 0].max(), W)
    v0, v1 = _covering(uv[:, 1].min(), uv[:, 1].max(), H)
    if u1 <= u0 or v1 <= v0:
        assert tuple(box) == (0, 0, 0, 0)
    else:
        assert tuple(box) == (u0, v0, u1, v1)
    rng = np.random.default_rng(0)
    surface = rng.uniform(-0.1, 0.1, (200, 3))
    surface[np.arange(200), rng.integers(0, 3, 200)] = rng.choice([-0.1, 0.1], 200)  # on a face
    p = view.project(surface @ ob.quaternion_matrices(np.array(pose[3:])).T + pose[:3]).uv
    inside = (p[:, 0] > -0.5) & (p[:, 0] < W - 0.5) & (p[:, 1] > -0.5) & (p[:, 1] < H - 0.5)
    px = np.floor(p[inside] + 0.5).astype(int)
    assert np.all((px[:, 0] >= box[0]) & (px[:, 0] < box[2]) & (px[:, 1] >= box[1]) & (px[:, 1] < box[3]))


def test_boxes_are_clipped_and_empty_out_of_view_or_behind_the_camera():
    view = CameraView(K, T_LOOK_X)
    poses = np.stack([_pose(1.0, -0.45), _pose(1.0, 5.0), _pose(-1.0), _pose(0.05)])[:, None]
    boxes = ob.project_boxes(view, [CUBE], poses)[:, 0]
    assert boxes[0, 2] == W and 0 < boxes[0, 0] < W  # reaches past the right edge (-y is right): clipped
    assert tuple(boxes[1]) == (0, 0, 0, 0)  # far to the left
    assert tuple(boxes[2]) == (0, 0, 0, 0)  # behind the camera
    assert tuple(boxes[3]) == (0, 0, 0, 0)  # a corner behind the near plane
    assert list(ob.box_visible(boxes)) == [True, False, False, False]


def test_hull_points_contain_each_shape():
    cylinder = ob.SceneObject("c", "cylinder", (0.05, 0.2), False)
    a = np.linspace(0, 2 * np.pi, 721)
    rim = np.stack([0.05 * np.cos(a), 0.05 * np.sin(a), np.full_like(a, 0.1)], axis=1)
    hull = cylinder.hull_points()
    assert hull.shape == (2 * ob.CYLINDER_SIDES, 3) and np.allclose(np.abs(hull[:, 2]), 0.1)
    # every rim point is inside the circumscribed polygon: its projection on each corner direction is <= the apothem
    normals = hull[: ob.CYLINDER_SIDES, :2] / np.linalg.norm(hull[: ob.CYLINDER_SIDES, :2], axis=1, keepdims=True)
    mid = (normals + np.roll(normals, 1, axis=0)) / 2
    mid /= np.linalg.norm(mid, axis=1, keepdims=True)
    assert np.all(rim[:, :2] @ mid.T <= 0.05 + 1e-12)
    sphere = ob.SceneObject("s", "sphere", (0.03,), False).hull_points()
    assert np.allclose(np.abs(sphere), 0.03)
    assert np.allclose(np.abs(CUBE.hull_points()), 0.1)


# ---- moved, lifted, first move -------------------------------------------------------------------------------


def test_moved_and_lifted_flags_follow_the_thresholds():
    base = _pose(0.5, 0.0, 0.7)
    frames = [base, base + [0.004, 0, 0, 0, 0, 0, 0],  # 4 mm: not displaced
              base + [0.006, 0, 0, 0, 0, 0, 0],  # 6 mm: the first move
              _pose(0.5, 0.0, 0.7, _yaw(math.radians(1.0))),  # 1 deg only: not displaced, but has moved
              _pose(0.5, 0.0, 0.7, _yaw(math.radians(3.0))),  # 3 deg: displaced again
              base + [0, 0, 0.02, 0, 0, 0, 0],  # lifted 2 cm
              base]  # back where it was
    still = [_pose(0.6, 0.1, 0.7)] * len(frames)
    track = ob.object_track(np.stack([frames, still], axis=1))
    assert track.displaced[:, 0].tolist() == [False, False, True, False, True, True, False]
    assert track.moved[:, 0].tolist() == [False, False, True, True, True, True, True]
    assert track.lifted[:, 0].tolist() == [False, False, False, False, False, True, False]
    assert track.first_move.tolist() == [2, -1]
    assert not track.moved[:, 1].any() and not track.lifted[:, 1].any()
    with pytest.raises(ValueError, match="finite"):
        ob.object_track(np.full((2, 1, 7), np.nan))


def test_poses_at_a_frame_are_the_newest_stamped_at_or_before_it():
    objects = ob.TwinObjects("s", 3, (CUBE,), np.array([100, 200, 200, 300], dtype=np.int64),
                             np.stack([_pose(k)[None] for k in range(4)]))
    poses, age = objects.sample(np.array([50, 100, 150, 200, 299, 1000]))
    assert np.isnan(poses[0]).all() and age[0] == -1
    assert poses[1:, 0, 0].tolist() == [0, 0, 2, 2, 3]  # equal stamps: the later in file order
    assert age[1:].tolist() == [0, 50, 0, 99, 700]
    assert objects.layout == "s/seed=3"


def test_scene_json_and_layouts():
    doc = {"scene": "pick_place", "seed": 7, "objects": [
        {"name": "cube", "shape": "box", "size": [0.07, 0.07, 0.07], "color": [1, 0, 0, 1], "fixed": False},
        {"name": "base", "shape": "cylinder", "size": [0.1, 0.02], "fixed": True}]}
    scene, seed, objects = ob.scene_objects(json.dumps(doc))
    assert (scene, seed, [o.name for o in objects], objects[1].fixed) == ("pick_place", 7, ["cube", "base"], True)
    bad = dict(doc, objects=[{"name": "x", "shape": "cone", "size": [1.0]}])
    with pytest.raises(ValueError, match="'x'.*cone"):
        ob.scene_objects(json.dumps(bad))
    with pytest.raises(ValueError, match="not the twin's scene"):
        ob.scene_objects("{}")
    assert ob.episode_layout({"extra": {"twin": {"scene": "pick_place", "seed": 7}}}) == "pick_place/seed=7"
    assert ob.episode_layout({"extra": {}}) is None and ob.episode_layout({}) is None


# ---- in clip files -------------------------------------------------------------------------------------------


def _clip(t: int = 5) -> Clip:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (t, H, W, 3), dtype=np.uint8)
    return Clip(frames, frames[::-1].copy(), rng.normal(size=(t, 54)).astype(np.float32),
                np.arange(t, dtype=np.int64) * 10, "ep", 4)


def _clip_objects(t: int = 5) -> ob.ClipObjects:
    poses = np.stack([np.stack([_pose(1.0 + 0.01 * k), _pose(2.0)]) for k in range(t)])
    track = ob.object_track(poses)
    boxes = ob.project_boxes(CameraView(K, T_LOOK_X), [CUBE, CUBE], poses)
    return ob.ClipObjects((CUBE, CUBE._replace(name="other")), "s/seed=1", poses, boxes, track.displaced,
                          track.moved, track.lifted, track.first_move + 4)


def test_a_clip_file_carries_objects_and_reads_back_unchanged(tmp_path):
    path = tmp_path / "c.safetensors"
    clip, objects = _clip(), _clip_objects()
    write_clip(path, clip)
    assert ob.read_clip_objects(path) is None  # a clip without objects
    ob.add_to_clip_file(path, objects)
    again = read_clip(path)
    for key in ("frames", "conditions", "actions", "stamps_ns"):
        np.testing.assert_array_equal(getattr(again, key), getattr(clip, key))
    assert (again.episode, again.start) == (clip.episode, clip.start)
    back = ob.read_clip_objects(path)
    assert back.objects == objects.objects and back.layout == "s/seed=1"
    for key in ob.CLIP_KEYS:
        np.testing.assert_array_equal(getattr(back, key), getattr(objects, key))
    assert not list(tmp_path.glob(".*"))  # no staging file left
    with pytest.raises(DatasetError, match="objects.poses has shape"):
        ob.add_to_clip_file(path, _clip_objects(t=9))


# ---- region metrics on hand-made frames ----------------------------------------------------------------------

BACKGROUND, SQUARE = 40, 200  # grey levels
S = 12  # [px] the square's side


def _square(u: int, v: int, level: int = SQUARE) -> np.ndarray:
    frame = np.full((H, W, 3), BACKGROUND, np.uint8)
    frame[v:v + S, u:u + S] = level
    return frame


def test_box_psnr_of_itself_of_a_shift_and_of_a_blank_frame():
    truth = _square(30, 20)
    box = (30, 20, 30 + S, 20 + S)
    assert metrics.box_psnr(truth, truth, box) == metrics.PSNR_CAP_DB
    for k in (1, 3, 5):  # shifted k px right: k columns of the box show the background
        mse = k * (SQUARE - BACKGROUND) ** 2 / S
        assert metrics.box_psnr(_square(30 + k, 20), truth, box) == pytest.approx(10 * math.log10(255**2 / mse))
    blank = np.zeros_like(truth)
    assert metrics.box_psnr(blank, truth, box) == pytest.approx(20 * math.log10(255 / SQUARE))
    assert math.isnan(metrics.box_psnr(blank, truth, (0, 0, 0, 0)))
    assert math.isnan(metrics.box_psnr(blank, truth, (W, 0, W + 5, 10)))  # off the image
    # the pixels outside the box do not count
    other = truth.copy()
    other[:5] = 255
    assert metrics.box_psnr(other, truth, box) == metrics.PSNR_CAP_DB


def test_box_ssim_of_itself_of_a_blank_frame_and_of_the_whole_image():
    truth = _square(30, 20)
    box = (30, 20, 30 + S, 20 + S)
    assert metrics.box_ssim(truth, truth, box) == pytest.approx(1.0, abs=1e-12)
    # a black frame against a flat region: no variance, the SSIM is the luminance term
    big = np.full((H, W, 3), BACKGROUND, np.uint8)
    big[20:44, 30:54] = SQUARE  # 24 px: its pixels at least half a window (5 px) inside see only the square
    inner = (35, 25, 49, 39)
    c1 = (0.01 * 255) ** 2
    assert metrics.box_ssim(np.zeros_like(big), big, inner) == pytest.approx(c1 / (SQUARE**2 + c1), rel=1e-9)
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    b = np.clip(a.astype(int) + rng.integers(-50, 51, a.shape), 0, 255).astype(np.uint8)
    assert metrics.box_ssim(a, b, (0, 0, W, H)) == pytest.approx(float(metrics.ssim(a, b)[0]), rel=1e-9)
    assert math.isnan(metrics.box_ssim(a, b, (0, 0, 4, 4)))  # all within the border band
    shifted = metrics.box_ssim(_square(33, 20), truth, box)
    assert shifted < metrics.box_ssim(_square(31, 20), truth, box) < 1.0  # further off, less similar


def _textured(u: int, v: int, seed: int = 0, size: tuple[int, int] = (14, 10)) -> np.ndarray:
    frame = np.full((H, W, 3), 90, np.uint8)
    frame[v:v + size[0], u:u + size[1]] = np.random.default_rng(seed).integers(0, 256, size + (3,), dtype=np.uint8)
    return frame


@pytest.mark.parametrize(("du", "dv"), [(0, 0), (1, 0), (3, 0), (0, -2), (4, 3)])
def test_a_patch_shifted_by_k_pixels_is_found_k_pixels_away(du, dv):
    truth = _textured(40, 25)
    mask = np.zeros((H, W), bool)
    mask[25:39, 40:50] = True
    found = metrics.locate_patch(_textured(40 + du, 25 + dv), truth, mask, search_px=8)
    assert found.found and found.measurable and found.score > 0.99
    assert (found.dx, found.dy) == (pytest.approx(du, abs=0.1), pytest.approx(dv, abs=0.1))
    assert found.distance == pytest.approx(math.hypot(du, dv), abs=0.15)


def test_a_patch_that_is_not_there_is_not_found():
    truth = _textured(40, 25)
    mask = np.zeros((H, W), bool)
    mask[25:39, 40:50] = True
    blank = metrics.locate_patch(np.zeros_like(truth), truth, mask, search_px=8)
    assert not blank.found and blank.measurable and math.isnan(blank.distance)
    far = metrics.locate_patch(_textured(60, 25), truth, mask, search_px=8)  # 20 px away: beyond the search
    assert not far.found
    other = metrics.locate_patch(_textured(40, 25, seed=9), truth, mask, search_px=8)  # another texture
    assert not other.found and other.score < metrics.PATCH_MIN_SCORE
    flat = metrics.locate_patch(truth, np.full_like(truth, 90), mask, search_px=8)  # nothing to locate
    assert not flat.measurable and not flat.found
    assert not metrics.locate_patch(truth, truth, np.zeros((H, W), bool), 8).measurable
    with pytest.raises(ValueError, match="mask"):
        metrics.locate_patch(truth, truth, mask[:10], 8)


# ---- a scripted twin episode ---------------------------------------------------------------------------------


def test_the_boxes_of_a_twin_layout_hold_what_the_synthetic_camera_draws_of_each_object():
    """The synthetic head camera draws the twin's objects at their layout poses (its own ray caster and the
    description's camera): each object's pixels (what changes when it is left out of the scene) lie in its box,
    up to one pixel of anti-aliasing, and the box is tight (a sphere's circumscribed cube is looser)."""
    from rynn_teleop.sources.camera.synthetic import reference_frame

    run = scripted_twin_run("pick_place", 0)
    w, h = 128, 96
    robot = RobotModel.default()
    doc = json.loads(run.scene_json)
    _, _, objects = ob.scene_objects(run.scene_json)
    boxes = ob.project_boxes(CameraView.from_robot(robot, default_intrinsics(w, h)), objects, run.objects[0][1][None])
    full = reference_frame(w, h, robot, twin_scene=run.scene_json)
    for k, (obj, box) in enumerate(zip(objects, boxes[0])):
        without = reference_frame(w, h, robot, twin_scene=json.dumps(dict(doc, objects=[
            o for i, o in enumerate(doc["objects"]) if i != k])))
        rows, cols = np.nonzero(np.any(full != without, axis=-1))
        assert len(rows) > 20, obj.name
        drawn = (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1)
        assert drawn[0] >= box[0] - 1 and drawn[1] >= box[1] - 1, obj.name
        assert drawn[2] <= box[2] + 1 and drawn[3] <= box[3] + 1, obj.name
        slack = 3 if obj.shape == "sphere" else 1
        assert box[0] >= drawn[0] - slack and box[1] >= drawn[1] - slack, obj.name
        assert box[2] <= drawn[2] + slack and box[3] <= drawn[3] + slack, obj.name


def test_a_scripted_twin_episode_gives_clips_whose_cube_moves_when_grasped(tmp_path):
    from rynn_teleop.world_model.training.dataset import build_dataset

    path, run = scripted_twin_episode(tmp_path / "episodes", "pick_place", 0)
    assert run.label == "success"
    info = build_dataset([path], tmp_path / "ds", clip_frames=9, objects=True, echo=None)
    entry = info.episodes[0]
    names = [o["name"] for o in entry["objects"]["objects"]]
    assert names == ["red_cube", "green_cylinder", "yellow_ball"] and entry["layout"] == "pick_place/seed=0"
    cube = names.index("red_cube")
    first = entry["objects"]["first_move"]
    assert first[cube] > 0  # the cube rests until the hand takes it ...
    assert first[names.index("yellow_ball")] == -1  # ... and the ball, out of the way, never moves
    stamps, moved, lifted, poses = [], [], [], []
    for f in entry["clips"]:
        clip, objects = read_clip(tmp_path / "ds" / f), ob.read_clip_objects(tmp_path / "ds" / f)
        keep = slice(0 if not stamps else 1, None)  # consecutive clips share a frame
        stamps += clip.stamps_ns[keep].tolist()
        moved += objects.moved[keep, cube].tolist()
        lifted += objects.lifted[keep, cube].tolist()
        poses += list(objects.poses[keep, cube])
        assert np.all(objects.first_move == first)
    assert moved.index(True) == first[cube] and all(moved[first[cube]:])
    assert any(lifted)  # carried to the goal
    start = run.objects[0][1][cube]
    assert np.allclose(poses[0], start, atol=1e-3)  # the layout pose: the first frame's
    doc = json.loads((tmp_path / "ds" / ob.OBJECTS_FILE).read_text())
    assert doc["split_by"] == "layout" and doc["layouts"]["train"] == ["pick_place/seed=0"]


def test_the_mover_mask_is_the_union_of_the_moving_objects_boxes_grown_and_clipped():
    """Per frame: the boxes of the objects that move (not the still one, not the fixed one, nothing for a box out
    of view), grown by the margin and clipped to the frame."""
    t, h, w = 3, 20, 30
    objects = (CUBE, CUBE._replace(name="still"), CUBE._replace(name="fixed", fixed=True))
    boxes = np.zeros((t, 3, 4), np.int32)
    boxes[0, 0] = (2, 3, 6, 5)
    boxes[1, 0] = (26, 17, 30, 20)  # at the frame's corner: the margin is clipped
    boxes[2, 0] = (0, 0, 0, 0)  # out of view
    boxes[:, 1] = (10, 10, 12, 12)
    boxes[:, 2] = (14, 2, 18, 6)
    first_move = np.array([1, -1, 0])
    flags = np.zeros((t, 3), bool)
    clip_objects = ob.ClipObjects(objects, "s/seed=1", np.zeros((t, 3, 7)), boxes, flags, flags, flags, first_move)
    mask = clip_objects.mover_mask(h, w, margin_px=1)
    expected = np.zeros((t, h, w), bool)
    expected[0, 2:6, 1:7] = True
    expected[1, 16:20, 25:30] = True
    np.testing.assert_array_equal(mask, expected)
    np.testing.assert_array_equal(clip_objects.mover_mask(h, w)[0], expected[0] & np.pad(
        np.ones((2, 4), bool), ((3, h - 5), (2, w - 6))))
