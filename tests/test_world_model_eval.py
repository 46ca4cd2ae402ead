"""World-model evaluation: the image metrics on known images, LPIPS's plumbing, and ``evaluate`` end to end on
tiny clips (metrics.json, plots, side-by-side video, the baselines, the errors a user can cause)."""

from __future__ import annotations

import argparse
import json
import math
import sys

import av
import numpy as np
import pytest
import torch

from rynn_teleop.core.arm_teleop import DEFAULT_HOME
from rynn_teleop.core.camera import default_intrinsics
from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.conditioning import Conditioner
from rynn_teleop.world_model.diffusion.composite import CompositeSettings
from rynn_teleop.world_model.diffusion.model import save_model, untrained_model
from rynn_teleop.world_model.diffusion.presets import TINY
from rynn_teleop.world_model.diffusion.weights import FineTunedWeightsError
from rynn_teleop.world_model.training import evaluate as ev
from rynn_teleop.world_model.training import metrics
from rynn_teleop.world_model.training import objects as ob
from rynn_teleop.world_model.training.clips import Clip, DatasetError, DatasetInfo, read_clip, write_clip

W, H = TINY.width, TINY.height
CLIP_FRAMES = 9
SQUARE = 14  # [px] side of the moving square (the object that moves)
MOVE_FRAME = 4  # the square rests in frames 0..3 and moves 6 px a frame from frame 4 on
STILL_BOX = (70, 40, 84, 54)  # [px] u0, v0, u1, v1 of an object that never moves


# ---- metrics ------------------------------------------------------------------------------------------------


def _images(seed: int, shape=(3, H, W, 3), noise: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    b = np.clip(a.astype(int) + rng.integers(-noise, noise + 1, a.shape), 0, 255).astype(np.uint8)
    return a, b


def _gaussian_ssim(x: np.ndarray, y: np.ndarray, data_range: float = 255.0) -> float:
    """Wang et al. 2004 (as scikit-image's gaussian_weights=True, sigma=1.5, use_sample_covariance=False): 11-tap
    Gaussian window, statistics only where the window lies inside the image, mean over pixels then channels."""
    from numpy.lib.stride_tricks import sliding_window_view

    taps = np.exp(-np.arange(-5, 6) ** 2 / (2 * 1.5**2))
    taps /= taps.sum()

    def filt(img):
        rows = sliding_window_view(img, 11, axis=0) @ taps
        return sliding_window_view(rows, 11, axis=1) @ taps

    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    out = []
    for c in range(x.shape[-1]):
        a, b = x[..., c].astype(float), y[..., c].astype(float)
        ma, mb = filt(a), filt(b)
        vaa, vbb, vab = filt(a * a) - ma**2, filt(b * b) - mb**2, filt(a * b) - ma * mb
        out.append(np.mean((2 * ma * mb + c1) * (2 * vab + c2) / ((ma**2 + mb**2 + c1) * (vaa + vbb + c2))))
    return float(np.mean(out))


def test_identical_frames_give_the_psnr_cap_and_ssim_one():
    a, _ = _images(0)
    assert np.all(metrics.psnr(a, a) == metrics.PSNR_CAP_DB)
    np.testing.assert_allclose(metrics.ssim(a, a), 1.0, atol=1e-12)


@pytest.mark.parametrize("offset", [1, 5, 40])
def test_psnr_of_a_known_mse(offset):
    a = np.full((2, H, W, 3), 100, dtype=np.uint8)
    b = a + np.uint8(offset)
    b[1, ::2] -= np.uint8(2 * offset)  # every other row below: the squared error is still offset**2 everywhere
    np.testing.assert_allclose(metrics.psnr(b, a), 10 * math.log10(255**2 / offset**2), rtol=1e-6)
    # float images with their own range
    np.testing.assert_allclose(metrics.psnr(b / 255.0, a / 255.0, data_range=1.0), 20 * math.log10(255 / offset),
                               rtol=1e-6)


def test_ssim_of_flat_images_is_the_luminance_term():
    a, b = np.full((H, W, 3), 100, np.uint8), np.full((H, W, 3), 120, np.uint8)
    c1 = (0.01 * 255) ** 2
    expected = (2 * 100 * 120 + c1) / (100**2 + 120**2 + c1)  # no variance: contrast-structure term is 1
    np.testing.assert_allclose(metrics.ssim(a, b), [expected], rtol=1e-10)


@pytest.mark.parametrize("seed", [1, 2])
def test_ssim_is_the_gaussian_window_definition(seed):
    a, b = _images(seed, noise=60)
    np.testing.assert_allclose(metrics.ssim(a, b), [_gaussian_ssim(x, y) for x, y in zip(a, b)], rtol=1e-9)


@pytest.mark.parametrize("seed", [3, 4])
def test_ssim_equals_torchmetrics_on_the_valid_area(seed):
    a, b = _images(seed, noise=60)
    b[1] = a[1]  # one identical frame
    np.testing.assert_allclose(metrics.ssim(a, b), metrics.ssim_torchmetrics(a, b), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(metrics.ssim(a / 255.0, b / 255.0, data_range=1.0), metrics.ssim(a, b), rtol=1e-9)


def test_metric_shape_rules():
    a, b = _images(3)
    assert metrics.psnr(a[0], b[0]).shape == (1,)  # one frame (H, W, 3)
    assert metrics.ssim(a, b).shape == (3,)
    with pytest.raises(ValueError, match="same shape"):
        metrics.psnr(a, b[:2])
    with pytest.raises(ValueError, match="RGB"):
        metrics.ssim(a[..., 0], b[..., 0])
    with pytest.raises(ValueError, match="at least 11 px"):
        metrics.ssim(a[:, :8, :8], b[:, :8, :8])


def test_masked_psnr_uses_only_the_masked_pixels():
    a = np.full((H, W, 3), 50, np.uint8)
    b = a.copy()
    b[:10] = 90  # wrong outside the mask
    b[20:30, 20:30] = 60
    mask = np.zeros((H, W), bool)
    mask[20:30, 20:30] = True
    assert metrics.masked_psnr(b, a, mask) == pytest.approx(20 * math.log10(255 / 10))
    assert math.isnan(metrics.masked_psnr(b, a, np.zeros((H, W), bool)))


def _random_trunk(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {f"features.{k}": v for k, v in metrics.alexnet_features().state_dict().items()}


def test_lpips_plumbing_with_a_random_trunk():
    lpips = metrics.Lpips(_random_trunk())
    a, b = _images(4)
    np.testing.assert_allclose(lpips.score(a, a), 0.0, atol=1e-12)
    assert np.all(lpips.score(a, b) > 0)
    assert np.all(lpips.score(a, 255 - a) > lpips.score(a, b))  # less similar, larger
    assert lpips.score(a[0], b[0]).shape == (1,)
    with pytest.raises(ValueError, match="same shape"):
        lpips.score(a, b[:1])
    with pytest.raises(ValueError, match="at least 31 px"):
        lpips.score(a[:, :24], b[:, :24])


def test_lpips_equals_torchmetrics_given_the_same_trunk(monkeypatch):
    """torchmetrics' own LPIPS, its torchvision trunk replaced by the same (random) one: the same numbers."""
    from torchmetrics.functional.image import lpips as reference

    trunk = metrics.alexnet_features()
    trunk.load_state_dict({k.removeprefix("features."): v for k, v in _random_trunk(1).items()})
    monkeypatch.setattr(reference, "_get_tv_model_features", lambda net, pretrained=False: trunk)
    theirs = reference._LPIPS(pretrained=True, net="alex", pnet_rand=True)
    a, b = _images(5)
    x0, x1 = (torch.tensor(x).permute(0, 3, 1, 2).double() / 127.5 - 1 for x in (a, b))
    expected = theirs.double()(x0, x1).reshape(-1).numpy()
    np.testing.assert_allclose(metrics.Lpips(_random_trunk(1)).double().score(a, b), expected, rtol=1e-5)
    assert "torchvision" not in sys.modules


def test_lpips_backbone_files(tmp_path):
    good = tmp_path / "alexnet.pth"
    torch.save({**_random_trunk(), "classifier.1.weight": torch.zeros(4, 4)}, good)
    assert set(metrics.load_lpips_backbone(good)) == set(_random_trunk())
    bad = tmp_path / "other.pth"
    state = _random_trunk()
    del state["features.3.weight"]
    torch.save(state, bad)
    with pytest.raises(metrics.LpipsBackboneError, match=r"other\.pth.*features\.3\.weight"):
        metrics.load_lpips_backbone(bad)
    with pytest.raises(metrics.LpipsBackboneError, match="no such file"):
        metrics.load_lpips_backbone(tmp_path / "absent.pth")


# ---- evaluate -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def robot() -> RobotModel:
    return RobotModel.default()


def _in_view(robot: RobotModel) -> np.ndarray:
    """Arms at DEFAULT_HOME, shoulders raised (hands in the head camera's view), fingers half closed [rad]."""
    q = robot.neutral()
    q[:14] = DEFAULT_HOME
    q[0] -= 0.3
    q[7] += 0.3
    lim = robot.limits
    q[14:] = lim.lower[14:] + 0.5 * (lim.upper[14:] - lim.lower[14:])
    return q


def _square_at(t: int, seed: int) -> tuple[int, int]:
    """(u, v) [px] of the moving square's top-left corner at frame t."""
    return 10 + 6 * max(0, t - MOVE_FRAME + 1) + seed, 20 + seed


def _clip(robot: RobotModel, episode: str, seed: int) -> Clip:
    """A square resting, then moving, and a still blue square over a grey background with the robot's skeleton
    drawn where forward kinematics puts it (the hands have texture where their keypoints project), the actions
    moving a shoulder, a box as the condition."""
    rng = np.random.default_rng(seed)
    skeleton = Conditioner(robot, default_intrinsics(640, 480).scaled(W, H))
    frames = np.full((CLIP_FRAMES, H, W, 3), 90, np.uint8)
    conditions = np.zeros_like(frames)
    actions = np.repeat(_in_view(robot)[None], CLIP_FRAMES, axis=0)
    for t in range(CLIP_FRAMES):
        actions[t, 0] += 0.02 * t
        drawn = skeleton.condition_image(actions[t])
        frames[t] = np.where(drawn.any(axis=-1, keepdims=True), drawn, frames[t])
        x, y = _square_at(t, seed)
        frames[t, y:y + SQUARE, x:x + SQUARE] = (200, 60, 40)
        u0, v0, u1, v1 = STILL_BOX
        frames[t, v0:v1, u0:u1] = (40, 60, 200)
        frames[t] = np.clip(frames[t] + rng.integers(-3, 4, frames[t].shape), 0, 255).astype(np.uint8)
        conditions[t, y:y + 10, x:x + 10] = 255
    return Clip(frames, conditions, actions.astype(np.float32), np.arange(CLIP_FRAMES, dtype=np.int64) * 100_000_000,
                episode, 0)


def _clip_objects(seed: int) -> ob.ClipObjects:
    """The clip's objects: the square (moves from MOVE_FRAME on), the still square, a fixed platform out of view."""
    t = np.arange(CLIP_FRAMES)
    boxes = np.zeros((CLIP_FRAMES, 3, 4), np.int32)
    for k in t:
        x, y = _square_at(int(k), seed)
        boxes[k, 0] = (x, y, x + SQUARE, y + SQUARE)
        boxes[k, 1] = STILL_BOX
    poses = np.zeros((CLIP_FRAMES, 3, 7))
    poses[..., 6] = 1.0
    moved = np.zeros((CLIP_FRAMES, 3), bool)
    moved[:, 0] = t >= MOVE_FRAME
    objects = (ob.SceneObject("square", "box", (0.05, 0.05, 0.05), False),
               ob.SceneObject("still", "box", (0.05, 0.05, 0.05), False),
               ob.SceneObject("platform", "cylinder", (0.1, 0.02), True))
    return ob.ClipObjects(objects, "test/seed=0", poses, boxes, moved.copy(), moved, np.zeros_like(moved),
                          np.array([MOVE_FRAME, -1, -1], np.int64))


def _dataset(root, robot: RobotModel, splits=("train", "val", "val"), preset: str = "tiny",
             objects: bool = False) -> None:
    episodes = []
    for k, split in enumerate(splits):
        rel = f"clips/{split}/{k:06d}.safetensors"
        write_clip(root / rel, _clip(robot, f"ep{k}", k))
        if objects:
            ob.add_to_clip_file(root / rel, _clip_objects(k))
        episodes.append({"path": f"/episodes/ep{k}", "name": f"ep{k}", "split": split, "frames": CLIP_FRAMES,
                         "clips": [rel]})
    intrinsics = default_intrinsics(640, 480)  # the recorded camera's: scaled to the clips' size by eval
    DatasetInfo(preset=preset, width=W, height=H, fps=10.0, clip_frames=CLIP_FRAMES,
                joint_names=list(robot.joint_names), seed=0, val_fraction=0.5,
                condition={"intrinsics": {**intrinsics._asdict(), "coeffs": list(intrinsics.coeffs)}},
                episodes=episodes).write(root)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("model")
    save_model(untrained_model(TINY, 0), root / "base", root / "weights", root / "prompt.safetensors")
    save_model(untrained_model(TINY, 1), root / "base1", root / "teacher", root / "prompt1.safetensors")
    return {"base_dir": root / "base", "weights_dir": root / "weights", "prompt_file": root / "prompt.safetensors",
            "teacher": root / "teacher"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, robot):
    root = tmp_path_factory.mktemp("dataset")
    _dataset(root, robot, objects=True)
    return root


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    path = tmp_path_factory.mktemp("lpips") / "alexnet.pth"
    torch.save(_random_trunk(), path)  # the plumbing only: never a reported number
    return path


@pytest.fixture(scope="module")
def result(tmp_path_factory, dataset, model_dirs, backbone):
    out = tmp_path_factory.mktemp("eval")
    res = ev.evaluate(dataset, out, base_dir=model_dirs["base_dir"], weights_dir=model_dirs["weights_dir"],
                      prompt_file=model_dirs["prompt_file"], teacher_weights_dir=model_dirs["teacher"],
                      lpips_backbone=backbone)
    return out, res


def test_evaluate_writes_metrics_plots_and_video(result):
    out, res = result
    assert json.loads((out / ev.METRICS_FILE).read_text()) == res
    for model in ("student", "teacher", "reconstruction", "baseline", "render"):
        for metric in ("psnr", "ssim", "lpips", "hand_psnr", *ev.OBJECT_METRICS):
            assert isinstance(res[f"{model}_{metric}"], float), f"{model}_{metric}"
        assert f"{model}_hand_shift_px" in res and f"{model}_hand_within_3px" in res
        frames = res["models"][model]
        assert frames["object_frames_before"] == 2 * (MOVE_FRAME - 1)  # frames 1..3 of both clips
        assert frames["object_frames_after"] == 2 * (CLIP_FRAMES - MOVE_FRAME)
        assert frames["object_frames_moving"] == frames["object_frames_after"]  # the square rests at frame 0
    promised = [res["files"]["metrics"], res["files"]["video"], *res["files"]["plots"]]
    assert {"psnr.png", "ssim.png", "lpips.png", "hand_psnr.png", "hand_shift_px.png", "object_psnr.png",
            "object_ssim.png", "object_psnr_moving.png"} <= set(res["files"]["plots"])
    for name in promised:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert res["objects"]["measured"] and res["objects"]["reason"] is None
    assert [c["moved_objects"] for c in res["clips"]] == [{"square": MOVE_FRAME}] * 2  # not the still or fixed one
    assert res["hand"]["threshold_px"] == 3.0 and res["hand"]["search_px"] >= 4
    assert "PSNR before" in ev.format_table(res) and "PSNR moving" in ev.format_table(res)
    assert res["held_out_frames"] == 2 * (CLIP_FRAMES - 1)
    assert [c["file"] for c in res["clips"]] == ["clips/val/000001.safetensors", "clips/val/000002.safetensors"]
    student = res["models"]["student"]
    assert student["per_frame"]["frame"] == list(range(1, CLIP_FRAMES))
    assert student["per_frame"]["count"] == [2] * (CLIP_FRAMES - 1)
    assert student["per_chunk"]["first_frame"] == [1, 5] and len(student["per_chunk"]["psnr"]) == 2
    assert student["psnr"] == pytest.approx(np.mean(student["per_chunk"]["psnr"]))
    assert res["inputs"]["weights_manifest"]["preset"] == "tiny"
    assert res["inputs"]["intrinsics"]["width"] == W and res["inputs"]["intrinsics_source"].endswith("scaled")
    assert res["lpips"]["measured"]
    for plot in ("psnr.png", "ssim.png", "lpips.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with av.open(str(out / ev.VIDEO_FILE)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 2 * CLIP_FRAMES
    assert frames[0].shape[1] == 6 * W  # ground truth | model | teacher | VAE round trip | render | repeat first


def test_the_reconstruction_is_diffusers_own_vae_round_trip_of_the_true_frames(result, dataset, model_dirs):
    """The ceiling row: each clip encoded (posterior mean) and decoded by the base's AutoencoderKLWan, called
    through diffusers' own forward (not the streaming wrapper eval uses), scored against the truth."""
    from diffusers import AutoencoderKLWan

    from rynn_teleop.world_model.diffusion.vae import pixels_to_rgb, rgb_to_pixels

    _, res = result
    vae = AutoencoderKLWan.from_pretrained(str(model_dirs["base_dir"]), subfolder="vae").eval()
    for row in res["clips"]:
        clip = read_clip(dataset / row["file"])
        with torch.no_grad():
            video = vae(rgb_to_pixels(clip.frames), sample_posterior=False).sample
        frames = pixels_to_rgb(video)[1:]
        want = [10 * math.log10(255**2 / max(np.mean((f.astype(float) - t.astype(float)) ** 2), 1e-12))
                for f, t in zip(frames, clip.frames[1:])]
        np.testing.assert_allclose(row["scores"]["reconstruction"]["psnr"], want, atol=0.05)


def test_moving_scores_keep_only_objects_that_rest_at_the_anchor():
    """Two objects shifted by k px after frame 1 of 3: *_after scores both; *_moving only the one that had not
    moved at the clip's anchor frame (the other's first move came before the clip)."""
    truth = np.zeros((3, 40, 60, 3), np.uint8)
    truth[:, 5:15, 5:15] = 200
    truth[:, 20:30, 30:40] = 120
    pred = truth.copy()
    pred[1:, 20:30, 30:40] = 0  # wrong only in the second object's box, only after the move
    boxes = np.tile(np.array([[5, 5, 15, 15], [30, 20, 40, 30]], np.int32), (3, 1, 1))
    moved = np.array([[False, False], [True, True], [True, True]])
    both = ev.object_scores(pred, truth, boxes, moved, np.array([True, True]), np.array([True, True]))
    only_first = ev.object_scores(pred, truth, boxes, moved, np.array([True, True]), np.array([True, False]))
    np.testing.assert_array_equal(both.psnr_after, both.psnr_moving)
    np.testing.assert_array_equal(both.psnr_after, only_first.psnr_after)
    assert np.isnan(only_first.psnr_moving[0])  # before the move: no moving frame
    assert (only_first.psnr_moving[1:] == metrics.PSNR_CAP_DB).all()  # the first object is right
    wrong = 10 * math.log10(255**2 / 120**2)  # the second box: 120 where 0 is drawn
    np.testing.assert_allclose(both.psnr_moving[1:], (metrics.PSNR_CAP_DB + wrong) / 2)  # the mean over both


def test_repeat_first_frame_baseline_is_the_psnr_by_hand(result, dataset):
    _, res = result
    by_hand = []
    for row in res["clips"]:
        clip = read_clip(dataset / row["file"])
        first = clip.frames[0].astype(float)
        per_frame = [10 * math.log10(255**2 / np.mean((f.astype(float) - first) ** 2)) for f in clip.frames[1:]]
        np.testing.assert_allclose(row["scores"]["baseline"]["psnr"], per_frame, rtol=1e-6)
        by_hand += per_frame
    assert res["baseline_psnr"] == pytest.approx(np.mean(by_hand), rel=1e-6)


def test_object_box_scores_of_the_baseline_are_the_box_psnr_by_hand(result, dataset):
    """Repeat-first against the truth inside the moving square's box: before its move only the noise differs,
    after it the box holds what frame 0 shows there (by hand: the mean squared error over the box)."""
    _, res = result
    before, after = [], []
    for row in res["clips"]:
        clip, objects = read_clip(dataset / row["file"]), ob.read_clip_objects(dataset / row["file"])
        expected_before, expected_after = [], []
        for t in range(1, clip.length):
            u0, v0, u1, v1 = objects.boxes[t, 0]
            mse = np.mean((clip.frames[0, v0:v1, u0:u1].astype(float) - clip.frames[t, v0:v1, u0:u1]) ** 2)
            value = 10 * math.log10(255**2 / mse)
            expected_before.append(value if t < MOVE_FRAME else None)
            expected_after.append(value if t >= MOVE_FRAME else None)
        scores = row["scores"]["baseline"]
        for got, want in ((scores["object_psnr_before"], expected_before), (scores["object_psnr_after"],
                                                                           expected_after)):
            assert [g is None for g in got] == [w is None for w in want]
            np.testing.assert_allclose([g for g in got if g is not None], [w for w in want if w is not None],
                                       rtol=1e-9)
        before += [w for w in expected_before if w is not None]
        after += [w for w in expected_after if w is not None]
    assert res["baseline_object_psnr_before"] == pytest.approx(np.mean(before))
    assert res["baseline_object_psnr_after"] == pytest.approx(np.mean(after))
    assert res["baseline_object_psnr_before"] > res["baseline_object_psnr_after"] + 10  # the move is what differs
    curve = res["models"]["baseline"]["per_frame"]
    assert curve["object_psnr_before"][MOVE_FRAME - 1:] == [None] * (CLIP_FRAMES - MOVE_FRAME)
    assert curve["object_psnr_after"][:MOVE_FRAME - 1] == [None] * (MOVE_FRAME - 1)


def test_the_baselines_hand_shift_grows_as_the_hand_moves_away_from_frame_0(result):
    """The left shoulder turns 0.02 rad a frame: repeat-first shows the left hand where frame 0 had it, further
    from its keypoints every frame (the right hand stays: a shift of 0)."""
    _, res = result
    curve = res["models"]["baseline"]["per_frame"]
    shift, within = curve["hand_shift_px"], curve["hand_within_3px"]
    assert all(v is not None for v in shift) and shift[0] < 1.5 and shift[-1] > shift[0] + 1.5
    assert within[0] == 1.0 and within[-1] < 1.0
    assert res["models"]["baseline"]["hand_shift_frames"] == res["held_out_frames"]


def test_hand_regions_are_where_forward_kinematics_projects_the_hands(robot, result):
    intrinsics = default_intrinsics(640, 480).scaled(W, H)
    conditioner = Conditioner(robot, intrinsics)
    q = _in_view(robot)
    mask = ev.hand_masks(conditioner, q[None], margin=2)[0]
    keypoints = conditioner.keypoints(q)
    wrist = conditioner.view.project(np.stack([keypoints.left_hand[0], keypoints.right_hand[0]])).uv
    inside = [p for p in wrist if 0 <= p[0] < W and 0 <= p[1] < H]
    assert inside, "the test configuration should show a wrist"
    for u, v in inside:
        assert mask[int(round(v)), int(round(u))]
    assert 0 < mask.mean() < 0.5
    _, res = result
    assert res["models"]["baseline"]["hand_frames"] == res["held_out_frames"]
    assert isinstance(res["baseline_hand_psnr"], float)


def test_cli_without_lpips_backbone_or_objects_reports_null(tmp_path, robot, model_dirs, capsys):
    dataset = tmp_path / "plain"
    _dataset(dataset, robot)  # clips without objects: a dataset built without --objects
    parser = argparse.ArgumentParser()
    ev.add_arguments(parser)
    out = tmp_path / "eval"
    args = parser.parse_args([str(dataset), "--base-dir", str(model_dirs["base_dir"]), "--weights-dir",
                              str(model_dirs["weights_dir"]), "--prompt-file", str(model_dirs["prompt_file"]),
                              "--out", str(out), "--max-clips", "1", "--no-render", "--no-reconstruction"])
    assert ev.run_cli(args) == 0
    printed = capsys.readouterr().out
    assert "student" in printed and str(out / ev.METRICS_FILE) in printed
    res = json.loads((out / ev.METRICS_FILE).read_text())
    assert res["student_lpips"] is None and res["baseline_lpips"] is None
    assert not res["lpips"]["measured"] and "lpips-backbone" in res["lpips"]["reason"]
    assert res["teacher_psnr"] is None and res["render_psnr"] is None and res["reconstruction_psnr"] is None
    assert res["held_out_frames"] == CLIP_FRAMES - 1
    assert not (out / "lpips.png").exists() and (out / "psnr.png").exists()
    assert not res["objects"]["measured"] and "--objects" in res["objects"]["reason"]
    assert all(res[f"student_{m}"] is None for m in ev.OBJECT_METRICS) and not (out / "object_psnr.png").exists()
    for name in [res["files"]["metrics"], res["files"]["video"], *res["files"]["plots"]]:
        assert (out / name).is_file(), name


def test_cli_composite_scores_the_served_compositing(tmp_path, dataset, model_dirs):
    """--composite reaches the student (through the backend) and the reconstruction: with thresholds no change
    reaches, both show frame 0 exactly, so they score as repeat-first on every frame."""
    parser = argparse.ArgumentParser()
    ev.add_arguments(parser)
    out = tmp_path / "eval"
    args = parser.parse_args([str(dataset), "--base-dir", str(model_dirs["base_dir"]), "--weights-dir",
                              str(model_dirs["weights_dir"]), "--prompt-file", str(model_dirs["prompt_file"]),
                              "--out", str(out), "--max-clips", "1", "--no-render", "--composite",
                              "--composite-low", "254", "--composite-high", "255"])
    assert ev.run_cli(args) == 0
    res = json.loads((out / ev.METRICS_FILE).read_text())
    assert res["inputs"]["composite"] == {"low": 254.0, "high": 255.0, "blur_px": CompositeSettings().blur_px,
                                          "reach_px": 0.0, "reference": "anchor"}
    scores = res["clips"][0]["scores"]
    for model in ("student", "reconstruction"):
        assert scores[model]["psnr"] == scores["baseline"]["psnr"], model
    assert res["student_psnr"] == res["reconstruction_psnr"] == res["baseline_psnr"] < metrics.PSNR_CAP_DB
    with pytest.raises(ConfigurationError, match="composite_low"):
        ev.run_cli(parser.parse_args([str(dataset), "--base-dir", str(model_dirs["base_dir"]), "--weights-dir",
                                      str(model_dirs["weights_dir"]), "--prompt-file", str(model_dirs["prompt_file"]),
                                      "--out", str(out), "--composite", "--composite-low",
                                      str(CompositeSettings().high + 1)]))  # above the default high


def test_cli_composite_over_the_render_reference_scores_as_the_render_backend(tmp_path, dataset, model_dirs):
    """--composite-reference render with thresholds no change reaches: the student and the reconstruction show
    the render backend's frame for each action exactly, so they score as render on every frame."""
    parser = argparse.ArgumentParser()
    ev.add_arguments(parser)
    out = tmp_path / "eval"
    args = parser.parse_args([str(dataset), "--base-dir", str(model_dirs["base_dir"]), "--weights-dir",
                              str(model_dirs["weights_dir"]), "--prompt-file", str(model_dirs["prompt_file"]),
                              "--out", str(out), "--max-clips", "1", "--composite", "--composite-low", "254",
                              "--composite-high", "255", "--composite-reference", "render"])
    assert ev.run_cli(args) == 0
    res = json.loads((out / ev.METRICS_FILE).read_text())
    assert res["inputs"]["composite"]["reference"] == "render"
    scores = res["clips"][0]["scores"]
    assert scores["render"]["psnr"] != scores["baseline"]["psnr"]  # the robot is drawn
    for model in ("student", "reconstruction"):
        assert scores[model]["psnr"] == scores["render"]["psnr"], model
        assert scores[model]["ssim"] == scores["render"]["ssim"], model


def test_the_reconstructions_reach_gate_follows_the_clips_condition_images(tmp_path, dataset, model_dirs):
    """Every change counts, but only within reach of the condition images' sweep from frame 1 on (the clips'
    conditions: a 10 px box at the moving square): the composited reconstruction is frame 0 exactly everywhere
    farther than reach_px from every box drawn so far, and differs from it near the boxes."""
    from rynn_teleop.world_model.diffusion.model import load_model
    from rynn_teleop.world_model.diffusion.presets import TINY as preset

    model = load_model(preset, model_dirs["base_dir"], model_dirs["weights_dir"], model_dirs["prompt_file"], "cpu",
                       torch.float32)
    clip = read_clip(dataset / "clips" / "val" / "000001.safetensors")
    frames = ev.vae_round_trip(model.vae, clip, CompositeSettings(low=0.0, high=1e-3, blur_px=0.0, reach_px=3.0))
    plain = ev.vae_round_trip(model.vae, clip, CompositeSettings(low=0.0, high=1e-3, blur_px=0.0))
    for t in range(1, clip.length):
        swept = (clip.conditions[1:t + 1] > 0).any(axis=(0, -1))
        near = torch.nn.functional.max_pool2d(torch.from_numpy(swept).float()[None, None], 7, 1, 3)[0, 0].bool()
        far = ~near.numpy()
        assert np.array_equal(frames[t - 1][far], clip.frames[0][far])
        assert np.array_equal(frames[t - 1][swept], plain[t - 1][swept])  # on the sweep: the ungated pixel
    assert not np.array_equal(frames, np.repeat(clip.frames[:1], clip.length - 1, axis=0))


def test_a_dataset_without_val_clips_is_refused(tmp_path, robot, model_dirs):
    _dataset(tmp_path / "ds", robot, splits=("train", "train"))
    with pytest.raises(DatasetError, match="no val clips"):
        ev.evaluate(tmp_path / "ds", tmp_path / "out", base_dir=model_dirs["base_dir"],
                    weights_dir=model_dirs["weights_dir"], prompt_file=model_dirs["prompt_file"])


def test_a_dataset_of_another_preset_is_refused(tmp_path, robot, model_dirs):
    _dataset(tmp_path / "ds", robot, splits=("val",), preset="paper")
    with pytest.raises(DatasetError, match="'paper'.*'tiny'"):
        ev.evaluate(tmp_path / "ds", tmp_path / "out", base_dir=model_dirs["base_dir"],
                    weights_dir=model_dirs["weights_dir"], prompt_file=model_dirs["prompt_file"], preset="tiny")


def test_a_weights_folder_of_another_preset_is_refused(tmp_path, dataset, model_dirs):
    import shutil

    weights = tmp_path / "weights"
    shutil.copytree(model_dirs["weights_dir"], weights)
    manifest = json.loads((weights / "manifest.json").read_text())
    manifest["preset"] = "paper"
    (weights / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FineTunedWeightsError, match="preset: found 'paper', expected 'tiny'"):
        ev.evaluate(dataset, tmp_path / "out", base_dir=model_dirs["base_dir"], weights_dir=weights,
                    prompt_file=model_dirs["prompt_file"])
    with pytest.raises(ConfigurationError, match="weights_dir is required"):
        ev.evaluate(dataset, tmp_path / "out", base_dir=model_dirs["base_dir"], weights_dir="",
                    prompt_file=model_dirs["prompt_file"])
