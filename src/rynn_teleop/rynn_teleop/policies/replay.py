"""The ``replay`` policy backend: one recorded demonstration played open-loop (the baseline of a learned policy).

It reads an exported LeRobot dataset (format v3.0, as ``rynn-teleop episodes export`` writes it:
:mod:`rynn_teleop.recording.lerobot`): ``meta/info.json`` gives the spec (``fps``; the joint names of
``observation.state`` and ``action``; each camera key ``observation.images.<key>`` of the robot's feeds, with its
(height, width), depth keys left out), and the data files ``data/chunk-*/file-*.parquet`` give the ``action`` rows of
episode ``episode`` (column ``episode_index``), in ``frame_index`` order. :meth:`ReplayPolicy.act` ignores the
observation and returns the next recorded action, holding the last one after the end; :meth:`ReplayPolicy.reset`
starts again from the first. On a randomised layout this is what "doing what the demonstration did" scores, with no
feedback at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..core.params import Param
from ..errors import ConfigurationError, ParameterError
from .base import ACTION_KEY, IMAGE_PREFIX, POLICY_BACKENDS, STATE_KEY, PolicyContext, PolicyRunner, PolicySpec


class DatasetError(ConfigurationError):
    """A folder that is not a usable exported dataset, or an episode it does not hold."""


def read_spec(root: Path, source: str = "") -> PolicySpec:
    """The :class:`PolicySpec` of the dataset at ``root`` (its ``meta/info.json``; see the module doc).

    Raises:
        DatasetError: no info.json, or one without fps, state or action names.
    """
    from ..recording.frames import FEED_TOPICS
    from ..recording.lerobot import INFO_PATH  # PyAV and pyarrow: imported when a replay is built, not registered

    path = root / INFO_PATH
    try:
        info = json.loads(path.read_text())
        features = info["features"]
        fps = float(info["fps"])
        state = tuple(str(n) for n in features[STATE_KEY]["names"])
        action = tuple(str(n) for n in features[ACTION_KEY]["names"])
    except FileNotFoundError:
        raise DatasetError(f"{root} is not an exported LeRobot dataset: no {INFO_PATH}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{path}: no usable fps, {STATE_KEY} names and {ACTION_KEY} names ({exc!r})") from None
    images: dict[str, tuple[int, int]] = {}
    for key, feature in features.items():
        camera = key[len(IMAGE_PREFIX):] if key.startswith(IMAGE_PREFIX) else None
        if camera in FEED_TOPICS:  # a feed's colour frames; depth keys (<feed>_depth) are not a policy's camera
            try:
                height, width = (int(v) for v in feature["shape"][:2])
            except (KeyError, TypeError, ValueError) as exc:
                raise DatasetError(f"{path}: feature {key!r} has no (height, width, 3) shape ({exc!r})") from None
            images[camera] = (height, width)
    return PolicySpec(fps, state, action, images, source or str(root))


def read_actions(root: Path, episode: int) -> np.ndarray:
    """(frames, n) float64 [rad] the ``action`` rows of ``episode`` in the data files under ``root``, by
    ``frame_index``.

    Raises:
        DatasetError: no data file, or no row of that episode (the message lists the episodes there are).
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    files = sorted((root / "data").glob("chunk-*/*.parquet"))
    if not files:
        raise DatasetError(f"{root} has no data files (data/chunk-*/*.parquet)")
    frames: list[np.ndarray] = []
    actions: list[np.ndarray] = []
    seen: set[int] = set()
    for path in files:
        try:
            table = pq.read_table(path, columns=["episode_index", "frame_index", ACTION_KEY])
        except (OSError, ValueError, KeyError) as exc:  # pyarrow's errors derive from these
            raise DatasetError(f"{path}: cannot read episode_index, frame_index and {ACTION_KEY}: {exc}") from None
        episodes = table.column("episode_index")
        seen.update(int(e) for e in pc.unique(episodes).to_pylist())
        rows = table.filter(pc.equal(episodes, episode))
        if rows.num_rows:
            column = rows.column(ACTION_KEY).combine_chunks()
            actions.append(np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=float)
                           .reshape(rows.num_rows, -1))
            frames.append(rows.column("frame_index").to_numpy())
    if not actions:
        known = ", ".join(str(e) for e in sorted(seen)) or "none"
        raise DatasetError(f"{root} holds no episode {episode} (episodes: {known})")
    order = np.argsort(np.concatenate(frames), kind="stable")
    return np.concatenate(actions)[order]


@POLICY_BACKENDS.register
class ReplayPolicy(PolicyRunner):
    """One recorded episode's actions, open-loop (see the module doc).

    Args:
        dataset: the exported dataset's root folder (``meta/info.json``, ``data/``).
        episode: the episode index (``episode_index``) to replay.

    Raises:
        ParameterError: no dataset given (key ``dataset``).
        DatasetError: not a usable dataset, no such episode, or actions of another length than the spec's names.
    """

    name = "replay"
    SETTINGS = (
        Param("dataset", str, "", "an exported LeRobot dataset's root folder (meta/info.json, data/)"),
        Param("episode", int, 0, "the episode (episode_index) whose actions are replayed", min=0, max=2**31 - 1),
    )

    def __init__(self, dataset: str, episode: int = 0) -> None:
        if not str(dataset).strip():
            raise ParameterError("dataset", "parameter 'dataset' is empty: the replay needs an exported dataset")
        root = Path(dataset).expanduser()
        self.root = root
        self.episode = int(episode)
        self.spec = read_spec(root, f"{root} episode {self.episode} (open-loop replay)")
        self.actions = read_actions(root, self.episode)
        if self.actions.shape[1] != len(self.spec.action_names):
            raise DatasetError(f"{root}: episode {self.episode}'s actions have {self.actions.shape[1]} values, "
                               f"info.json names {len(self.spec.action_names)}")
        self.actions.flags.writeable = False
        self._next = 0  # the row act() returns next

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: PolicyContext) -> ReplayPolicy:
        return cls(settings["dataset"], settings["episode"])

    @property
    def frames(self) -> int:
        """[-] recorded actions."""
        return len(self.actions)

    def reset(self) -> None:
        self._next = 0

    def act(self, observation: Mapping[str, np.ndarray]) -> np.ndarray:
        """The next recorded action [rad] (the last one again after the end); ``observation`` is not used."""
        row = self.actions[min(self._next, len(self.actions) - 1)]
        self._next += 1
        return row.copy()
