"""A policy sees at run time exactly what its dataset held: the observation the policy node builds for a recorded
frame (:class:`~rynn_teleop.policies.observation.ObservationBuilder`, fed the episode's own messages) equals, element
by element, the frame LeRobot's own dataset reader returns for the exported episode (same image, same state), and the
LeRobot worker normalises it as LeRobot's preprocessor normalises the reader's frame.

The export is lossless (``--lossless``) and resized (``--image-size``), so equality is exact: any difference is a
difference of layout, sampling or resizing, not of the codec.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import recording_episodes
from recording_episodes import TS, build_episode
from rosbags.rosbag2 import Reader
from test_export import textured_rgb

from rynn_teleop.core.image import decode_image
from rynn_teleop.policies import STATE_KEY, image_key
from rynn_teleop.policies.lerobot import LeRobotPolicy, read_policy_folder, resolve_policy_folder
from rynn_teleop.policies.observation import ObservationBuilder
from rynn_teleop.recording.export import export_lerobot
from rynn_teleop.recording.frames import FEED_TOPICS, MEASURED_TOPIC
from rynn_teleop.recording.lerobot import VideoOptions

ROOT = Path(__file__).resolve().parents[1]
SIZE = (40, 30)  # --image-size (width, height) [px]
ROWS = (0, 7, 22)  # dataset frame indices compared


def _stamp(msg) -> int:
    return msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, Path]:
    """(the recorded episode, its lossless export at SIZE)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recording_episodes, "frame_rgb", textured_rgb)
        episode = build_episode(tmp_path_factory.mktemp("parity") / "ep", digital=False, seconds=1.0,
                                task="pick the cube")
    out = tmp_path_factory.mktemp("parity_ds") / "ds"
    export_lerobot([episode], out, "test/parity", fps=30, video=VideoOptions.lossless(), image_size=SIZE, workers=1)
    return episode, out


@pytest.fixture(scope="module")
def policy_folder(dataset, lerobot_python, tmp_path_factory) -> Path:
    """A tiny ACT folder trained on nothing, laid out by LeRobot's own save_pretrained, for the export."""
    out = tmp_path_factory.mktemp("parity_policy") / "policy"
    subprocess.run([lerobot_python, str(ROOT / "tests/lerobot_tiny_policy.py"), "write", str(dataset[1]), str(out),
                    "--repo-id", "test/parity"], check=True, capture_output=True, text=True, timeout=600)
    return out


def _lerobot_frame(lerobot_python: str, folder: Path, root: Path, index: int, out: Path) -> dict:
    subprocess.run([lerobot_python, str(ROOT / "tests/lerobot_tiny_policy.py"), "frame",
                    str(resolve_policy_folder(folder)), str(root), str(index), str(out)],
                   check=True, capture_output=True, text=True, timeout=600)
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def _built(episode: Path, spec, stamp_ns: int) -> dict:
    """The node's observation of the recorded frame stamped ``stamp_ns``: every joint state and that frame, as the
    node would have received them."""
    builder = ObservationBuilder(spec, history_s=3600.0)
    topic = FEED_TOPICS[next(iter(spec.images))]
    with Reader(episode) as reader:
        conns = [c for c in reader.connections if c.topic in (MEASURED_TOPIC, topic)]
        for conn, _, data in reader.messages(connections=conns):
            msg = TS.deserialize_cdr(data, conn.msgtype)
            if conn.topic == MEASURED_TOPIC:
                builder.add_joint_state(msg.name, msg.position, _stamp(msg))
            elif _stamp(msg) == stamp_ns:
                builder.add_image(next(iter(spec.images)), decode_image(msg), stamp_ns)
    built = builder.build()
    assert built is not None and built.stamp_ns == stamp_ns
    return built.values


def test_the_node_s_observation_is_the_reader_s_frame(dataset, policy_folder, lerobot_python, tmp_path):
    episode, root = dataset
    spec = read_policy_folder(policy_folder).spec
    assert dict(spec.images) == {"consumer": (SIZE[1], SIZE[0])}
    stamps = pq.read_table(next((root / "data").rglob("*.parquet")), columns=["stamp_ns"]).column(0).to_pylist()
    with LeRobotPolicy(policy_folder, python=lerobot_python, timeout_s=60) as runner:
        for row in ROWS:
            reader = _lerobot_frame(lerobot_python, policy_folder, root, row, tmp_path / f"{row}.npz")
            stamp = int(np.asarray(stamps[row]).reshape(-1)[0])
            obs = _built(episode, spec, stamp)
            image = image_key("consumer")
            assert obs[image].shape == reader[f"raw.{image}"].shape == (SIZE[1], SIZE[0], 3)
            np.testing.assert_array_equal(obs[image], reader[f"raw.{image}"])
            np.testing.assert_array_equal(obs[STATE_KEY], reader[f"raw.{STATE_KEY}"])
            normalized = runner.normalized(obs)
            for key in (image, STATE_KEY):
                np.testing.assert_allclose(normalized[key], reader[f"norm.{key}"], rtol=0, atol=1e-6)
