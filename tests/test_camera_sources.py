"""Head-camera sources: data shapes, the synthetic tabletop, replay (rosbag2 / video / images), RealSense."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from rynn_teleop.core.camera import (
    CameraFrame,
    CameraIntrinsics,
    Profile,
    default_intrinsics,
    parse_profile,
)
from rynn_teleop.core.image import decode_image
from rynn_teleop.errors import ConfigurationError, HardwareUnavailableError
from rynn_teleop.sources.camera import (
    CAMERA_BACKENDS,
    CameraSource,
    ReplayCamera,
    SyntheticScene,
    make_camera_source,
)
from rynn_teleop.sources.camera.realsense import RealSenseCamera, intrinsics_from_realsense
from rynn_teleop.sources.camera.scene import TabletopScene, sphere_span

# --------------------------------------------------------------------------------------------- core


def test_parse_profile_reads_width_height_fps():
    assert parse_profile("640x480x30") == (640, 480, 30) == Profile(640, 480, 30)
    assert parse_profile(" 1280X720x15 ") == Profile(1280, 720, 15)
    assert str(parse_profile("848x480x60")) == "848x480x60"
    for bad in ("640x480", "640x480x0", "640*480*30", "axbxc", "", "640x480x30x1", "-640x480x30"):
        with pytest.raises(ConfigurationError, match="bad camera profile") as info:
            parse_profile(bad)
        assert repr(bad) in str(info.value)


def test_intrinsics_matrices_and_default_law():
    K = default_intrinsics(640, 480)
    assert (K.fx, K.fy, K.cx, K.cy) == (615.0, 615.0, 320.0, 240.0)
    assert K.distortion_model == "plumb_bob" and K.coeffs == (0.0,) * 5
    np.testing.assert_array_equal(K.K(), [[615, 0, 320], [0, 615, 240], [0, 0, 1]])
    np.testing.assert_array_equal(K.P(), [[615, 0, 320, 0], [0, 615, 240, 0], [0, 0, 1, 0]])
    assert default_intrinsics(1280, 720).fx == 1230.0
    with pytest.raises(ConfigurationError, match="fx"):
        CameraIntrinsics(640, 480, 0.0, 615.0, 320.0, 240.0).check()
    with pytest.raises(ConfigurationError, match="size"):
        default_intrinsics(0, 480)


@settings(max_examples=40, deadline=None)
@given(
    w=st.integers(32, 2000), h=st.integers(32, 2000), u=st.floats(0, 1), v=st.floats(0, 1),
    w2=st.integers(32, 2000), h2=st.integers(32, 2000),
)
def test_scaled_intrinsics_map_pixel_centres_like_resize(w, h, u, v, w2, h2):
    K = CameraIntrinsics(w, h, 600.0, 610.0, 0.51 * w, 0.48 * h, "plumb_bob", (0.1, -0.2, 0.0, 0.0, 0.01))
    S = K.scaled(w2, h2)
    assert (S.width, S.height, S.coeffs) == (w2, h2, K.coeffs)
    # a ray (x, y) hits pixel centre p in K and p' = (p + 0.5) * s - 0.5 in S (cv2.resize's mapping)
    x, y = (u - 0.5) * 0.8, (v - 0.5) * 0.6
    p = np.array([K.fx * x + K.cx, K.fy * y + K.cy])
    p2 = np.array([S.fx * x + S.cx, S.fy * y + S.cy])
    np.testing.assert_allclose(p2, (p + 0.5) * [w2 / w, h2 / h] - 0.5, atol=1e-9)
    back = S.scaled(w, h)
    np.testing.assert_allclose(back[2:6], K[2:6], rtol=1e-12, atol=1e-9)


# --------------------------------------------------------------------------------------------- synthetic


def read_all(src: CameraSource, times) -> list[CameraFrame]:
    out: list[CameraFrame] = []
    for now in times:
        out += src.read(float(now))
    return out


def test_synthetic_is_deterministic_whatever_the_read_timing():
    a, b = SyntheticScene(160, 120, seed=3), SyntheticScene(160, 120, seed=3)
    a.start(10.0)
    b.start(10.0)
    got_a = a.read(10.5)
    got_b = read_all(b, [9.0, 10.0, 10.013, 10.2, 10.2, 10.37, 10.5])
    assert len(got_a) == len(got_b) == 16
    for x, y in zip(got_a, got_b, strict=True):
        assert x.stamp == y.stamp
        np.testing.assert_array_equal(x.color, y.color)
        np.testing.assert_array_equal(x.depth, y.depth)
    np.testing.assert_array_equal(a.render(0.2).color, got_a[6].color)  # frame k shows t = k / fps
    other = SyntheticScene(160, 120, seed=4)
    assert not np.array_equal(other.render(0.0).color, got_a[0].color)


def test_synthetic_frames_on_a_fixed_grid_with_sizes_and_dtypes():
    cam = SyntheticScene(200, 150, fps=20.0)
    with pytest.raises(RuntimeError):
        cam.read(0.0)
    with pytest.raises(RuntimeError):
        _ = cam.intrinsics
    cam.start(100.0)
    assert cam.read(99.0) == []
    got = cam.read(101.0) + cam.read(101.0)
    assert len(got) == 21
    np.testing.assert_allclose([f.stamp for f in got], 100.0 + np.arange(21) / 20.0, atol=1e-9)
    for f in got:
        assert f.color.shape == (150, 200, 3) and f.color.dtype == np.uint8
        assert f.depth is not None and f.depth.shape == (150, 200) and f.depth.dtype == np.uint16
        assert f.depth_scale == 0.001 and f.depth.min() > 0
    assert cam.has_depth and cam.depth_intrinsics == cam.intrinsics
    cam.close()
    with pytest.raises(RuntimeError):
        cam.read(102.0)
    flat = SyntheticScene(64, 48, depth=False)
    flat.start(0.0)
    assert flat.read(0.0)[0].depth is None and not flat.has_depth


def test_synthetic_late_read_returns_the_newest_frames_only():
    cam = SyntheticScene(64, 48, fps=30.0, max_backlog=5)
    cam.start(0.0)
    got = cam.read(10.0)
    assert len(got) == 5 and cam.dropped == 296
    np.testing.assert_allclose([f.stamp for f in got], np.arange(296, 301) / 30.0)
    assert len(cam.read(10.0 + 1 / 30)) == 1


def test_synthetic_ball_moves_unless_told_not_to():
    cam = SyntheticScene(160, 120, fps=30.0)
    cam.start(0.0)
    f0, f1 = cam.read(1 / 30)
    changed = np.any(f0.color != f1.color, axis=2)
    assert changed.any() and changed.mean() < 0.1  # only around the ball
    assert np.any(f0.depth != f1.depth)
    still = SyntheticScene(160, 120, moving=False)
    np.testing.assert_array_equal(still.render(0.0).color, still.render(1.7).color)


def test_synthetic_drawing_agrees_with_depth_and_intrinsics():
    cam = SyntheticScene(320, 240, seed=5)
    cam.start(0.0)
    K = cam.intrinsics
    assert K == default_intrinsics(320, 240)
    frame = cam.render(0.8)
    R, c = cam.T_world_camera[:3, :3], cam.T_world_camera[:3, 3]

    def world(u: int, v: int) -> np.ndarray:
        z = frame.depth[v, u] * frame.depth_scale
        return R @ (z * np.array([(u - K.cx) / K.fx, (v - K.cy) / K.fy, 1.0])) + c

    # the table plane: bottom rows back-project to z = 0 (within the mm rounding)
    for u in (40, 160, 280):
        assert abs(world(u, 235)[2]) < 0.004
    assert frame.depth[235, 160] < frame.depth[120, 160]  # the table recedes upwards in the image
    # the ball: its centre projects onto yellow pixels whose depth is the ball's front surface
    ball = cam.ball_center(0.8)
    p = R.T @ (ball - c)
    u, v = int(round(K.fx * p[0] / p[2] + K.cx)), int(round(K.fy * p[1] / p[2] + K.cy))
    r, g, b = frame.color[v, u].astype(int)
    assert r > 150 and g > 110 and b < 80, (r, g, b)
    assert np.linalg.norm(world(u, v) - ball) == pytest.approx(0.035, abs=0.004)
    # every object is in view and coloured as named
    names = [o.name for o in cam.objects]
    assert names == ["red_cube", "green_cylinder", "blue_bowl", "yellow_ball"]
    rgb = frame.color.reshape(-1, 3).astype(int)
    assert np.sum((rgb[:, 0] > 150) & (rgb[:, 1] < 60) & (rgb[:, 2] < 60)) > 30  # red cube
    assert np.sum((rgb[:, 1] > 100) & (rgb[:, 0] < 80) & (rgb[:, 2] < 90)) > 30  # green cylinder
    assert np.sum((rgb[:, 2] > 120) & (rgb[:, 0] < 90)) > 30  # blue bowl


def test_synthetic_render_time_640x480():
    cam = SyntheticScene(640, 480)
    t0 = time.perf_counter()
    cam.start(0.0)
    prepare = time.perf_counter() - t0
    cam.render(0.0)
    n = 30
    t0 = time.perf_counter()
    for k in range(n):
        cam.render(k / 30.0)
    per_frame = (time.perf_counter() - t0) / n
    print(f"synthetic 640x480: static scene {prepare * 1e3:.0f} ms once, {per_frame * 1e3:.2f} ms per frame")


def test_synthetic_rejects_bad_settings():
    for kwargs in ({"width": 8}, {"fps": 0.0}, {"fps": float("nan")}, {"max_backlog": 0}):
        with pytest.raises(ConfigurationError):
            SyntheticScene(**kwargs)


def test_synthetic_frames_are_the_scene_rendered_at_the_ball_position():
    cam = SyntheticScene(96, 72, seed=2)
    scene = TabletopScene(96, 72, seed=2)
    for t in (0.0, 0.4, 2.5):
        frame, image = cam.render(t), scene.render(scene.ball_center(t))
        np.testing.assert_array_equal(frame.color, image.color)
        np.testing.assert_array_equal(frame.depth, image.depth)
    assert scene.render(scene.ball_center(0.4), depth=False).depth is None
    with pytest.raises(ConfigurationError, match="size"):
        TabletopScene(4096, 8)


@settings(max_examples=200, deadline=None)
@given(
    x=st.floats(-0.5, 0.5),
    z=st.floats(0.05, 2.0),
    radius=st.floats(0.01, 0.2),
    f=st.floats(50.0, 1000.0),
    c=st.floats(0.0, 640.0),
)
def test_sphere_span_holds_every_ray_that_meets_the_sphere(x, z, radius, f, c):
    """No ray through a pixel (within 0.5 px of its centre) outside the span comes within ``radius`` of the centre."""
    lo, hi = -2000, 3000
    first, end = sphere_span(x, z, radius, f, c, lo, hi)
    assert first >= lo and end <= hi  # first >= end: empty
    if z <= radius:
        assert (first, end) == (lo, hi)
        return
    pixels = np.arange(lo, hi)
    outside = pixels[(pixels < first) | (pixels >= end)].astype(float)
    for du in (-0.5, 0.0, 0.5):
        a = (outside + du - c) / f  # ray (a, *, 1): the plane x = a z holds every such ray
        distance = np.abs(x - a * z) / np.sqrt(1.0 + a * a)  # of the sphere's centre from that plane [m]
        assert np.all(distance > radius)


# --------------------------------------------------------------------------------------------- replay: bags

TYPESTORE = get_typestore(Stores.ROS2_JAZZY)
T = TYPESTORE.types
BAG_FIRST_NS = 1_700_000_000_000_000_000
BAG_PERIOD_NS = 33_333_333


def header(stamp_ns: int, frame_id: str):
    return T["std_msgs/msg/Header"](
        stamp=T["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id=frame_id
    )


def image_msg(
    array: np.ndarray, encoding: str, stamp_ns: int, frame_id: str = "camera_color_optical_frame", pad: int = 0
):
    h, w = array.shape[:2]
    row = array.reshape(h, -1).view(np.uint8)
    step = row.shape[1] + pad
    data = np.zeros((h, step), np.uint8)
    data[:, : row.shape[1]] = row
    return T["sensor_msgs/msg/Image"](
        header=header(stamp_ns, frame_id), height=h, width=w, encoding=encoding, is_bigendian=0, step=step,
        data=data.reshape(-1),
    )


def camera_info_msg(K: CameraIntrinsics, stamp_ns: int):
    return T["sensor_msgs/msg/CameraInfo"](
        header=header(stamp_ns, "camera_color_optical_frame"), height=K.height, width=K.width,
        distortion_model=K.distortion_model, d=np.array(K.coeffs, float), k=K.K().ravel(),
        r=np.eye(3).ravel(), p=K.P().ravel(), binning_x=0, binning_y=0,
        roi=T["sensor_msgs/msg/RegionOfInterest"](x_offset=0, y_offset=0, height=0, width=0, do_rectify=False),
    )


BAG_K = CameraIntrinsics(32, 24, 30.5, 30.7, 15.2, 11.9, "plumb_bob", (0.1, -0.05, 0.001, 0.002, 0.0))


def color_frame(k: int, w: int = 32, h: int = 24) -> np.ndarray:
    """Frame k: red everywhere, k in the green channel of pixel (0, 0)."""
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 0] = 220
    img[0, 0, 1] = k
    return img


def write_camera_bag(
    path: Path, n: int = 10, *, encoding: str = "rgb8", info: bool = True, depth: bool = True,
    storage=StoragePlugin.MCAP, prefix: str = "/head_camera", extra: bool = True,
) -> list[int]:
    """A bag of n colour frames (+ CameraInfo, + 16UC1 depth) at 30 Hz; returns the header stamps [ns]."""
    stamps = [BAG_FIRST_NS + k * BAG_PERIOD_NS for k in range(n)]
    with Writer(path, version=9, storage_plugin=storage) as writer:
        c_img = writer.add_connection(f"{prefix}/color/image_raw", "sensor_msgs/msg/Image", typestore=TYPESTORE)
        c_info = (
            writer.add_connection(f"{prefix}/color/camera_info", "sensor_msgs/msg/CameraInfo", typestore=TYPESTORE)
            if info else None
        )
        c_depth = (
            writer.add_connection(f"{prefix}/depth/image_rect_raw", "sensor_msgs/msg/Image", typestore=TYPESTORE)
            if depth else None
        )
        c_other = writer.add_connection("/rosout_like", "std_msgs/msg/String", typestore=TYPESTORE) if extra else None
        for k, stamp in enumerate(stamps):
            img = color_frame(k)
            if encoding == "bgr8":
                img = img[..., ::-1].copy()
            elif encoding == "mono8":
                img = img[..., :1].copy()
            msg = image_msg(img, encoding, stamp, pad=4)
            writer.write(c_img, stamp + 5_000_000, TYPESTORE.serialize_cdr(msg, "sensor_msgs/msg/Image"))
            if c_info is not None:
                raw = TYPESTORE.serialize_cdr(camera_info_msg(BAG_K, stamp), "sensor_msgs/msg/CameraInfo")
                writer.write(c_info, stamp + 5_000_001, raw)
            if c_depth is not None:
                d = np.full((24, 32), 500 + k, np.uint16)
                dmsg = image_msg(d, "16UC1", stamp + 1_000_000, "camera_depth_optical_frame")  # 1 ms later
                writer.write(c_depth, stamp + 6_000_000, TYPESTORE.serialize_cdr(dmsg, "sensor_msgs/msg/Image"))
            if c_other is not None and k == 0:
                raw = TYPESTORE.serialize_cdr(T["std_msgs/msg/String"](data="hi"), "std_msgs/msg/String")
                writer.write(c_other, stamp, raw)
    return stamps


@pytest.mark.parametrize("storage", [StoragePlugin.MCAP, StoragePlugin.SQLITE3])
def test_bag_replay_frames_depth_intrinsics_and_recorded_timing(tmp_path, storage):
    bag = tmp_path / "episode"
    stamps = write_camera_bag(bag, storage=storage)
    cam = ReplayCamera(bag, loop=False)
    cam.start(50.0)
    assert cam.source_kind == "rosbag2"
    assert cam.intrinsics == BAG_K  # from CameraInfo
    assert cam.has_depth and cam.depth_intrinsics == BAG_K  # same size, no depth CameraInfo: registered
    assert cam.read(49.0) == []
    got = read_all(cam, np.arange(50.0, 50.5, 0.01))
    assert len(got) == 10 and cam.finished
    rel = (np.array(stamps) - stamps[0]) * 1e-9
    np.testing.assert_allclose([f.stamp for f in got], 50.0 + rel, atol=1e-9)
    for k, f in enumerate(got):
        assert f.color.shape == (24, 32, 3) and f.color.dtype == np.uint8
        assert tuple(f.color[5, 5]) == (220, 0, 0)  # RGB order: red is channel 0
        assert f.color[0, 0, 1] == k
        assert f.depth is not None and f.depth.dtype == np.uint16 and f.depth[3, 3] == 500 + k
    assert cam.read(100.0) == []
    cam.close()


def test_bag_replay_loops_with_time_increasing_and_retimes_at_a_rate(tmp_path):
    bag = tmp_path / "episode"
    write_camera_bag(bag, n=4)
    cam = ReplayCamera(bag)  # loop=True by default
    cam.start(0.0)
    got = cam.read(0.5)
    period = 4 * BAG_PERIOD_NS * 1e-9  # 3 intervals + one typical interval between passes
    expected = [p * period + k * BAG_PERIOD_NS * 1e-9 for p in range(4) for k in range(4)]
    expected = [s for s in expected if s <= 0.5]
    np.testing.assert_allclose([f.stamp for f in got], expected, atol=1e-9)
    assert [int(f.color[0, 0, 1]) for f in got] == [k % 4 for k in range(len(got))]
    assert np.all(np.diff([f.stamp for f in got]) > 0)
    fast = ReplayCamera(bag, rate_hz=10.0, loop=True)
    fast.start(5.0)
    got = fast.read(6.0)
    np.testing.assert_allclose([f.stamp for f in got], 5.0 + np.arange(11) / 10.0)
    assert [int(f.color[0, 0, 1]) for f in got] == [k % 4 for k in range(11)]


def test_replay_read_an_hour_late_returns_only_the_newest_frames_quickly(tmp_path):
    bag = tmp_path / "episode"
    write_camera_bag(bag, n=4)
    cam = ReplayCamera(bag, max_backlog=3)
    cam.start(0.0)
    t0 = time.monotonic()
    got = cam.read(3600.0)
    period, step = 4 * BAG_PERIOD_NS * 1e-9, BAG_PERIOD_NS * 1e-9
    last_pass = math.floor(3600.0 / period)
    candidates = sorted(
        (p * period + k * step, k) for p in range(last_pass - 2, last_pass + 2) for k in range(4)
    )
    newest = [c for c in candidates if c[0] <= 3600.0][-3:]
    np.testing.assert_allclose([f.stamp for f in got], [c[0] for c in newest], atol=1e-6)
    assert [int(f.color[0, 0, 1]) for f in got] == [c[1] for c in newest]
    assert cam.dropped > 100_000
    video = tmp_path / "clip.avi"
    write_video(video, "MJPG", n=6, fps=15.0)
    clip = ReplayCamera(video, max_backlog=4)
    clip.start(0.0)
    frames = clip.read(3600.0 + 2.5 / 15.0)  # newest due frame: k = 54002, the 3rd of its pass
    assert [f.stamp for f in frames] == pytest.approx(np.arange(53999, 54003) / 15.0)
    assert [int(np.sum(f.color[24, :, 1] > 100)) // 8 for f in frames] == [6, 1, 2, 3]
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("encoding", ["bgr8", "mono8"])
def test_bag_replay_converts_other_encodings_to_rgb(tmp_path, encoding):
    bag = tmp_path / "bag"
    write_camera_bag(bag, n=2, encoding=encoding, info=False, depth=False)
    cam = ReplayCamera(bag)
    cam.start(0.0)
    frame = cam.read(0.0)[0]
    expected = (220, 0, 0) if encoding == "bgr8" else (220, 220, 220)
    assert tuple(frame.color[5, 5]) == expected and frame.depth is None
    assert cam.intrinsics == default_intrinsics(32, 24) and not cam.has_depth


def test_bag_replay_errors_name_what_is_missing(tmp_path):
    bag = tmp_path / "bag"
    write_camera_bag(bag, n=2, prefix="/other_camera")
    with pytest.raises(ConfigurationError, match="/other_camera/color/image_raw") as info:
        ReplayCamera(bag).start(0.0)
    assert "/head_camera/color/image_raw" in str(info.value)
    with pytest.raises(ConfigurationError, match="depth_topic"):
        ReplayCamera(bag, topic="/other_camera/color/image_raw", depth_topic="/nope").start(0.0)
    with pytest.raises(ConfigurationError, match="/nope_info"):
        ReplayCamera(bag, topic="/other_camera/color/image_raw", info_topic="/nope_info").start(0.0)
    no_images = tmp_path / "no_images"
    with Writer(no_images, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("/chatter", "std_msgs/msg/String", typestore=TYPESTORE)
        writer.write(conn, 1, TYPESTORE.serialize_cdr(T["std_msgs/msg/String"](data="x"), "std_msgs/msg/String"))
    with pytest.raises(ConfigurationError, match=r"no sensor_msgs/msg/Image topic; its topics: /chatter"):
        ReplayCamera(no_images).start(0.0)
    odd = tmp_path / "odd"
    with Writer(odd, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("/head_camera/color/image_raw", "sensor_msgs/msg/Image", typestore=TYPESTORE)
        msg = image_msg(np.zeros((2, 2, 2), np.uint8), "yuv422", 1)
        writer.write(conn, 1, TYPESTORE.serialize_cdr(msg, "sensor_msgs/msg/Image"))
    with pytest.raises(ConfigurationError, match="yuv422"):
        ReplayCamera(odd).start(0.0)


def test_bag_replay_depth_topic_can_be_disabled_and_read_skips_without_decoding(tmp_path):
    bag = tmp_path / "bag"
    write_camera_bag(bag, n=6)
    cam = ReplayCamera(bag, depth_topic="", loop=False, max_backlog=2)
    cam.start(0.0)
    got = cam.read(10.0)
    assert [int(f.color[0, 0, 1]) for f in got] == [4, 5] and cam.dropped == 4
    assert got[0].depth is None and not cam.has_depth


def test_decode_image_handles_step_padding_endianness_and_float_depth():
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    np.testing.assert_array_equal(decode_image(image_msg(img, "rgb8", 0, pad=7)), img)
    big = SimpleNamespace(
        encoding="16UC1", height=1, width=2, step=4, is_bigendian=1, data=np.array([1, 2, 0, 3], np.uint8)
    )
    np.testing.assert_array_equal(decode_image(big, depth=True), [[258, 3]])
    metres = np.array([[0.5, np.nan, 70.0]], np.float32)
    np.testing.assert_array_equal(decode_image(image_msg(metres, "32FC1", 0), depth=True), [[500, 0, 0]])
    with pytest.raises(ValueError, match="16UC1"):
        decode_image(image_msg(np.zeros((1, 1), np.uint16), "16UC1", 0))  # depth encoding for colour


# --------------------------------------------------------------------------------------------- replay: video, images


def write_video(path: Path, fourcc: str, n: int = 6, fps: float = 15.0) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (64, 48))
    assert writer.isOpened(), f"no {fourcc} encoder in this OpenCV"
    for k in range(n):
        bgr = np.zeros((48, 64, 3), np.uint8)
        bgr[..., 2] = 220  # red, in OpenCV's BGR order
        bgr[:, : 8 * (k + 1), 1] = 200  # a green bar that grows
        writer.write(bgr)
    writer.release()


@pytest.mark.parametrize(("name", "fourcc"), [("clip.avi", "MJPG"), ("clip.mp4", "mp4v")])
def test_video_replay_in_rgb_at_its_fps_then_loops(tmp_path, name, fourcc):
    path = tmp_path / name
    write_video(path, fourcc)
    cam = ReplayCamera(path, loop=False)
    cam.start(2.0)
    assert cam.source_kind == "video" and cam.intrinsics == default_intrinsics(64, 48) and not cam.has_depth
    got = read_all(cam, np.arange(2.0, 3.0, 0.02))
    assert len(got) == 6 and cam.finished
    np.testing.assert_allclose([f.stamp for f in got], 2.0 + np.arange(6) / 15.0, atol=1e-9)
    r, g, b = got[0].color[24, 60].astype(int)
    assert r > 180 and g < 40 and b < 40  # read back as RGB
    assert [int(np.sum(f.color[24, :, 1] > 100)) // 8 for f in got] == [1, 2, 3, 4, 5, 6]
    looped = ReplayCamera(path, rate_hz=30.0)
    looped.start(0.0)
    frames = looped.read(0.5)
    assert len(frames) == 16
    np.testing.assert_allclose([f.stamp for f in frames], np.arange(16) / 30.0, atol=1e-9)
    bars = [int(np.sum(f.color[24, :, 1] > 100)) // 8 for f in frames]
    assert bars == [k % 6 + 1 for k in range(16)]
    looped.close()


def test_image_folder_replay_in_natural_order(tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    for k in (1, 2, 10):
        bgr = np.zeros((20, 30, 3), np.uint8)
        bgr[..., 2] = 230
        bgr[0, 0] = (0, k, 230)
        cv2.imwrite(str(folder / f"frame{k}.png"), bgr)
    (folder / "notes.txt").write_text("not an image")
    cam = ReplayCamera(folder, loop=False)
    cam.start(0.0)
    assert cam.source_kind == "images"
    got = cam.read(1.0)
    assert [int(f.color[0, 0, 1]) for f in got] == [1, 2, 10]
    assert tuple(got[1].color[10, 10]) == (230, 0, 0)
    np.testing.assert_allclose([f.stamp for f in got], np.arange(3) / 30.0)
    assert cam.intrinsics == default_intrinsics(30, 20)
    single = ReplayCamera(folder / "frame2.png", rate_hz=5.0)
    single.start(0.0)
    assert [f.stamp for f in single.read(1.0)] == pytest.approx(np.arange(6) / 5.0)


def test_image_folder_replay_skips_unreadable_images(tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    for k in range(3):
        cv2.imwrite(str(folder / f"{k:03d}.png"), np.full((8, 8, 3), 50 * k, np.uint8))
    (folder / "001.png").write_bytes(b"broken")
    cam = ReplayCamera(folder, loop=False)
    cam.start(0.0)
    got = cam.read(1.0)
    assert [int(f.color[0, 0, 0]) for f in got] == [0, 100] and cam.skipped == 1


def test_replay_errors_for_missing_empty_or_unreadable_paths(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        ReplayCamera(tmp_path / "nope").start(0.0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigurationError, match="no .png/.jpg/.jpeg image"):
        ReplayCamera(empty).start(0.0)
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00not a video" * 10)
    with pytest.raises(ConfigurationError, match="junk.mp4"):
        ReplayCamera(junk).start(0.0)
    for kwargs in ({"rate_hz": 0.0}, {"topic": ""}, {"max_backlog": 0}):
        with pytest.raises(ConfigurationError):
            ReplayCamera(tmp_path, **kwargs)
    with pytest.raises(RuntimeError):
        ReplayCamera(tmp_path).read(0.0)


# --------------------------------------------------------------------------------------------- factory


def test_make_camera_source_builds_each_kind_and_rejects_bad_requests(tmp_path):
    assert set(CAMERA_BACKENDS) == {"synthetic", "replay", "realsense"}
    assert isinstance(make_camera_source("synthetic", width=64, height=48), SyntheticScene)
    assert isinstance(make_camera_source("replay", path=tmp_path), ReplayCamera)
    assert isinstance(make_camera_source("realsense", serial="123"), RealSenseCamera)  # no SDK needed yet
    with pytest.raises(ConfigurationError, match="'usb': unknown head_camera backend; known: realsense, replay, "
                                                 "synthetic"):
        make_camera_source("usb")
    with pytest.raises(ConfigurationError, match="'synthetic'.*colour"):
        make_camera_source("synthetic", colour=True)
    with pytest.raises(ConfigurationError, match="bad camera profile"):
        make_camera_source("realsense", color_profile="640x480")


# --------------------------------------------------------------------------------------------- realsense (stand-in SDK)


class FakeFrame:
    def __init__(self, array: np.ndarray, stamp_ms: float, domain: str) -> None:
        self.array, self.stamp_ms, self.domain = array, stamp_ms, domain

    def get_data(self) -> np.ndarray:
        return self.array

    def get_timestamp(self) -> float:
        return self.stamp_ms

    def get_frame_timestamp_domain(self) -> str:
        return self.domain

    def __bool__(self) -> bool:
        return True


class FakeFrameset:
    def __init__(self, color: FakeFrame, depth: FakeFrame | None) -> None:
        self.color, self.depth = color, depth

    def __bool__(self) -> bool:
        return True

    def get_color_frame(self) -> FakeFrame:
        return self.color

    def get_depth_frame(self) -> FakeFrame | None:
        return self.depth


class FakeRealSense:
    """A stand-in of the pyrealsense2 module: devices, pipelines, configs and frames, recording the calls."""

    def __init__(self, serials=("111", "222"), producing: bool = True, domain: str = "hardware_clock") -> None:
        self.serials = list(serials)
        self.producing = producing
        self.domain = domain
        self.stamp_ms = 0.0
        self.calls: list[tuple] = []
        self.pipelines: list[FakeRealSense._Pipeline] = []
        self.supported = True
        self.poll_error: Exception | None = None
        fake = self
        self.stream = SimpleNamespace(color="color", depth="depth")
        self.format = SimpleNamespace(rgb8="rgb8", z16="z16")
        self.camera_info = SimpleNamespace(serial_number="serial_number", name="name")
        self.timestamp_domain = SimpleNamespace(
            hardware_clock="hardware_clock", system_time="system_time", global_time="global_time"
        )

        class _Device:
            def __init__(self, serial: str) -> None:
                self.serial = serial

            def get_info(self, what: str) -> str:
                return self.serial if what == "serial_number" else "Intel RealSense D435"

        class _Context:
            def query_devices(self):
                fake.calls.append(("query_devices",))
                return [_Device(s) for s in fake.serials]

        class _Config:
            def __init__(self) -> None:
                self.streams: list[tuple] = []
                self.device = None

            def enable_device(self, serial: str) -> None:
                self.device = serial
                fake.calls.append(("enable_device", serial))

            def enable_stream(self, *args) -> None:
                self.streams.append(args)
                fake.calls.append(("enable_stream", *args))

            def can_resolve(self, wrapper) -> bool:
                return fake.supported

        class _Intrinsics(SimpleNamespace):
            pass

        class _StreamProfile:
            def __init__(self, w: int, h: int) -> None:
                self.w, self.h = w, h

            def as_video_stream_profile(self):
                return self

            def get_intrinsics(self):
                return _Intrinsics(
                    width=self.w, height=self.h, fx=612.3, fy=611.9, ppx=318.4, ppy=243.1,
                    model="distortion.inverse_brown_conrady", coeffs=[0.0, 0.0, 0.0, 0.0, 0.0],
                )

        class _Profile:
            def __init__(self, config: _Config) -> None:
                self.config = config

            def get_stream(self, stream: str):
                for s in self.config.streams:
                    if s[0] == stream:
                        return _StreamProfile(s[1], s[2])
                raise RuntimeError(f"no {stream} stream")

            def get_device(self):
                return SimpleNamespace(first_depth_sensor=lambda: SimpleNamespace(get_depth_scale=lambda: 0.001))

        class _Pipeline:
            def __init__(self) -> None:
                self.config: _Config | None = None
                self.running = False
                fake.pipelines.append(self)

            def start(self, config: _Config) -> _Profile:
                fake.calls.append(("start", config.device))
                self.config, self.running = config, True
                return _Profile(config)

            def stop(self) -> None:
                fake.calls.append(("stop",))
                self.running = False

            def poll_for_frames(self):
                if fake.poll_error is not None:
                    raise fake.poll_error
                if not (self.running and fake.producing):
                    return None
                streams = {s[0]: s for s in self.config.streams}
                _, w, h, _, _ = streams["color"]
                color = np.zeros((h, w, 3), np.uint8)
                color[..., 0] = 200
                depth = None
                if "depth" in streams:
                    depth = FakeFrame(np.full((streams["depth"][2], streams["depth"][1]), 750, np.uint16), 0.0, "")
                fake.stamp_ms += 33.3
                return FakeFrameset(FakeFrame(color, fake.stamp_ms, fake.domain), depth)

        class _Align:
            def __init__(self, to: str) -> None:
                fake.calls.append(("align", to))

            def process(self, frames):
                return frames

        self.context = _Context
        self.config = _Config
        self.pipeline = _Pipeline
        self.pipeline_wrapper = lambda pipeline: pipeline
        self.align = _Align
        self._Pipeline = _Pipeline


def test_realsense_without_a_device_fails_at_once_without_starting_a_pipeline():
    fake = FakeRealSense(serials=())
    cam = RealSenseCamera(rs_module=fake)
    with pytest.raises(HardwareUnavailableError, match="no RealSense device connected"):
        cam.start(0.0)
    assert fake.pipelines == []
    with pytest.raises(RuntimeError):
        cam.read(0.0)


def test_realsense_unknown_serial_lists_the_serials_seen():
    cam = RealSenseCamera(serial="999", rs_module=FakeRealSense(serials=("111", "222")))
    with pytest.raises(HardwareUnavailableError, match="'999'.*111 .*222 "):
        cam.start(0.0)


def test_realsense_streams_arrays_with_device_intrinsics():
    fake = FakeRealSense()
    with RealSenseCamera(serial="222", color_profile="640x480x30", depth_profile="848x480x30", rs_module=fake) as cam:
        cam.start(5.0)
        assert ("enable_device", "222") in fake.calls
        assert ("enable_stream", "color", 640, 480, "rgb8", 30) in fake.calls
        assert ("enable_stream", "depth", 848, 480, "z16", 30) in fake.calls
        assert ("align", "color") in fake.calls
        K = cam.intrinsics
        assert (K.width, K.height, K.fx, K.fy, K.cx, K.cy) == (640, 480, 612.3, 611.9, 318.4, 243.1)
        assert K.distortion_model == "plumb_bob" and K.coeffs == (0.0,) * 5
        assert cam.depth_intrinsics == K  # aligned to colour
        (frame,) = cam.read(5.1)
        assert frame.stamp == 5.1  # hardware clock: stamped with the poll time
        assert frame.color.shape == (480, 640, 3) and frame.color.dtype == np.uint8 and frame.color[0, 0, 0] == 200
        assert frame.depth.dtype == np.uint16 and frame.depth[0, 0] == 750 and frame.depth_scale == 0.001
        assert cam.diagnostics()["serial"] == "222" and cam.frames == 1
    assert fake.pipelines[0].running is False  # closed by the context manager
    cam.close()  # idempotent


def test_realsense_unaligned_depth_has_its_own_intrinsics_and_first_device_is_default():
    fake = FakeRealSense()
    cam = RealSenseCamera(depth_profile="848x480x30", align_depth=False, rs_module=fake)
    cam.start(0.0)
    assert cam.device_serial == "111" and ("enable_device", "111") in fake.calls
    assert not any(c[0] == "align" for c in fake.calls)
    assert cam.depth_intrinsics.width == 848 and cam.intrinsics.width == 640
    assert cam.read(0.1)[0].depth.shape == (480, 848)
    cam.close()
    no_depth = RealSenseCamera(enable_depth=False, rs_module=FakeRealSense())
    no_depth.start(0.0)
    assert not no_depth.has_depth and no_depth.read(0.1)[0].depth is None
    no_depth.close()


def test_realsense_unsupported_profile_is_a_configuration_error():
    fake = FakeRealSense()
    fake.supported = False
    with pytest.raises(ConfigurationError, match="does not support colour 1234x480x30 rgb8"):
        RealSenseCamera(color_profile="1234x480x30", rs_module=fake).start(0.0)


@pytest.mark.parametrize(
    ("domain", "offset_s", "expected_offset"),
    [("system_time", -0.020, -0.020), ("global_time", -0.015, -0.015), ("global_time", -50.0, 0.0),
     ("system_time", +0.010, 0.0), ("hardware_clock", -0.020, 0.0)],
)
def test_realsense_uses_epoch_device_stamps_only_on_the_same_clock(domain, offset_s, expected_offset):
    fake = FakeRealSense(domain=domain)
    cam = RealSenseCamera(rs_module=fake)
    now = 1_700_000_000.0
    cam.start(now)
    fake.stamp_ms = (now + 1.0 + offset_s) * 1e3 - 33.3  # the next frame's stamp: (now + 1 + offset) [s]
    (frame,) = cam.read(now + 1.0)
    assert frame.stamp == pytest.approx(now + 1.0 + expected_offset, abs=1e-6)
    cam.close()


def wait_for(condition, cam: RealSenseCamera, now: float, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        cam.read(now)
        time.sleep(0.005)
    cam.read(now)


def test_realsense_restarts_the_pipeline_after_frames_stop():
    fake = FakeRealSense()
    cam = RealSenseCamera(recovery_timeout_s=0.5, rs_module=fake)
    cam.start(0.0)
    assert len(cam.read(0.1)) == 1
    fake.producing = False
    assert cam.read(0.5) == [] and cam.restarts == 0  # not yet 0.5 s without frames
    fake.poll_error = RuntimeError("Frame didn't arrive within 5000")  # a USB drop: read never raises
    assert cam.read(0.6) == [] and "Frame didn't arrive" in cam.last_error
    fake.poll_error = None
    t0 = time.monotonic()
    assert cam.read(0.7) == []  # 0.6 s without a frame: recovery starts in the background
    assert time.monotonic() - t0 < 0.1
    wait_for(lambda: cam.restarts == 1 and not cam.recovering, cam, 0.7)
    assert cam.restarts == 1 and len(fake.pipelines) == 2 and fake.pipelines[0].running is False
    assert "no frame for 0.6 s" in cam.last_error
    fake.producing = True
    assert len(cam.read(0.8)) == 1 and cam.diagnostics()["restarts"] == 1
    cam.close()
    assert not any(p.running for p in fake.pipelines)


def test_realsense_recovery_waits_for_the_device_to_come_back():
    fake = FakeRealSense(serials=("111",))
    cam = RealSenseCamera(recovery_timeout_s=0.2, rs_module=fake)
    cam.start(0.0)
    fake.producing = False
    fake.serials = []  # unplugged
    cam.read(0.3)
    wait_for(lambda: cam.failed_restarts >= 1 and not cam.recovering, cam, 0.3)
    assert cam.restarts == 0 and "not connected" in cam.last_error
    assert cam.read(0.4) == []  # a full timeout before the next attempt
    fake.serials, fake.producing = ["111"], True
    cam.read(0.6)
    wait_for(lambda: cam.restarts == 1 and not cam.recovering, cam, 0.6)
    assert cam.restarts == 1 and len(cam.read(0.7)) == 1
    cam.close()


def test_realsense_import_failure_names_the_package_and_libusb(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyrealsense2", None)  # makes "import pyrealsense2" raise ImportError
    with pytest.raises(HardwareUnavailableError, match="pyrealsense2.*libusb-1.0-0"):
        RealSenseCamera().start(0.0)


def test_realsense_intrinsics_conversion_names_distortion_like_realsense_ros():
    intr = SimpleNamespace(width=848, height=480, fx=420.0, fy=421.0, ppx=424.5, ppy=240.2,
                           model=SimpleNamespace(name="kannala_brandt4"), coeffs=[0.1, 0.2, 0.3, 0.4, 0.0])
    K = intrinsics_from_realsense(intr)
    assert K.distortion_model == "equidistant" and K.coeffs == (0.1, 0.2, 0.3, 0.4)
    intr.model = "distortion.brown_conrady"
    assert intrinsics_from_realsense(intr).coeffs == (0.1, 0.2, 0.3, 0.4, 0.0)


@pytest.mark.skipif(importlib.util.find_spec("pyrealsense2") is None, reason="pyrealsense2 is not installed")
def test_real_pyrealsense2_without_a_device_fails_fast():
    code = textwrap.dedent(
        """
        import time
        from rynn_teleop.errors import HardwareUnavailableError
        from rynn_teleop.sources.camera.realsense import RealSenseCamera
        t0 = time.monotonic()
        try:
            RealSenseCamera().start(0.0)
        except HardwareUnavailableError as exc:
            print("ERROR", exc)
        else:
            print("STARTED")  # a camera is connected here
        print("SECONDS", time.monotonic() - t0)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=False)
    out = done.stdout
    if "STARTED" in out:
        pytest.skip("a RealSense is connected")
    # no device (or, without Debian's libusb-1.0-0, no loadable SDK): a clear error, fast
    assert "ERROR no RealSense device connected" in out or "ERROR the 'pyrealsense2'" in out, out + done.stderr
    assert float(out.split("SECONDS")[1]) < 5.0


def test_synthetic_frames_rendered_ahead_are_the_same_frames():
    from rynn_teleop.sources.camera import SyntheticScene

    plain, ahead = SyntheticScene(width=64, height=48, seed=4), SyntheticScene(width=64, height=48, seed=4)
    plain.start(0.0)
    ahead.start(0.0)
    for k in range(5):
        ahead.prepare_next()  # as the camera node does right after publishing
        a, b = plain.read(k / 30.0), ahead.read(k / 30.0)
        assert len(a) == len(b) == 1 and a[0].stamp == b[0].stamp
        np.testing.assert_array_equal(a[0].color, b[0].color)
        np.testing.assert_array_equal(a[0].depth, b[0].depth)
