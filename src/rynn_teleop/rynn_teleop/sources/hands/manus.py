"""Manus glove raw skeletons -> the 21 MediaPipe keypoints (ROS-free).

The vendor's ``manus_ros2_msgs/msg/ManusGlove`` package is not public, so :func:`manus_to_mediapipe` reads
the fields by name and takes the real message or any stand-in with them: ``side`` ("Left" / "Right"),
optional ``raw_node_count`` (= ``len(raw_nodes)``), ``raw_nodes[]`` with ``node_id``, ``parent_node_id``,
``chain_type`` and ``pose`` (``geometry_msgs/Pose``).

Raw skeleton (Manus SDK): 25 nodes per hand: the wrist (chain ``Hand``), 4 thumb nodes and 5 per other
finger, each finger chain a path hanging off the wrist. The MediaPipe points are the wrist and the last four
nodes of each chain towards the tip; the tree, not ``joint_type`` (whose names are shifted), decides. Chain
types: strings ("Hand", "Thumb", ... "Pinky"), SDK enum names or members, or the SDK's integer values
(:data:`SDK_CHAIN_TYPES`).

Frames (assumption): all node positions are in one common glove frame, so the points are
``glove_to_wrist @ (p_node - p_wrist)``; orientations are not used. ``glove_to_wrist`` may be a reflection
(det = -1; left-handed SDK builds), which also swaps what looks like a left and a right hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from scipy.spatial.transform import Rotation

from ...core.hand_skeleton import FINGERS, N_POINTS
from ...core.layout import SIDES
from ...core.node_io import SENSOR_DATA, Each, NodeIO, Topic
from ...core.params import FLOAT_LIST, STR_LIST, Param
from ...errors import ConfigurationError
from .base import HAND_BACKENDS, HandContext, HandMessageError, MessageHands

HAND_CHAIN = "hand"
CHAIN_TYPES: tuple[str, ...] = (HAND_CHAIN, *FINGERS)
"""Chain labels after normalisation: "hand", "thumb", "index", "middle", "ring", "pinky"."""

SDK_CHAIN_TYPES: dict[int, str] = {5: "thumb", 6: "index", 7: "middle", 8: "ring", 9: "pinky", 13: "hand"}
"""Integer values of the Manus SDK ``ChainType`` enum for the hand chains (0 Invalid, 1 Arm, ... 13 Hand)."""

MIN_CHAIN_NODES = 4  # a finger chain needs at least the four MediaPipe nodes


class ManusSkeletonError(HandMessageError):
    """A glove message whose raw skeleton cannot be turned into the 21 keypoints.

    The glove node counts these and holds its last good skeleton.
    """


class ManusHand(NamedTuple):
    """One glove skeleton in MediaPipe order."""

    side: str  # "left" | "right"
    points: np.ndarray  # (21, 3) keypoints [m] relative to the wrist node, rotated by glove_to_wrist


def chain_label(value: Any) -> str | None:
    """The normalised chain label of a ``chain_type`` value, or None if it is not a hand chain.

    Accepts "Index", "index", "FingerIndex", "ChainType_FingerIndex", an
    object with a ``name`` attribute holding one of those (Python enums),
    and the SDK's integer values (:data:`SDK_CHAIN_TYPES`).
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return SDK_CHAIN_TYPES.get(int(value))
    if not isinstance(value, str):
        name = getattr(value, "name", None)
        if not isinstance(name, str):
            return None
        value = name
    label = value.strip().lower()
    for prefix in ("chaintype_", "chaintype.", "finger"):
        label = label.removeprefix(prefix)
    return label if label in CHAIN_TYPES else None


def side_label(value: Any) -> str:
    """"left" / "right" from a glove's ``side`` ("Left", "Right", "Side_Left", an enum member ...).

    Raises:
        ManusSkeletonError: anything else.
    """
    raw = value if isinstance(value, str) else getattr(value, "name", value)
    label = str(raw).strip().lower()
    label = label.removeprefix("side_")
    if label not in SIDES:
        raise ManusSkeletonError(f"glove side {value!r} is neither 'Left' nor 'Right'")
    return label


def _glove_rotation(glove_to_wrist: np.ndarray | None) -> np.ndarray:
    if glove_to_wrist is None:
        return np.eye(3)
    R = np.asarray(glove_to_wrist, dtype=float)
    if R.shape != (3, 3) or not np.all(np.isfinite(R)):
        raise ConfigurationError(f"glove_to_wrist must be a finite 3x3 matrix, got shape {R.shape}")
    if not np.allclose(R @ R.T, np.eye(3), atol=1e-6):
        raise ConfigurationError("glove_to_wrist must be a rotation (or reflection) matrix: R @ R.T != I")
    return R


def _position(node: Any) -> np.ndarray:
    p = node.pose.position
    return np.array([float(p.x), float(p.y), float(p.z)])


def manus_to_mediapipe(glove: Any, glove_to_wrist: np.ndarray | None = None) -> ManusHand:
    """The side and the (21, 3) MediaPipe keypoints [m] of a ``ManusGlove``-like message.

    Args:
        glove: a ``manus_ros2_msgs/msg/ManusGlove`` or a stand-in with its fields
            (see the module doc).
        glove_to_wrist: (3, 3) rotation (or reflection) from the glove frame of
            the node positions to the wrist frame wanted; default identity.

    Returns:
        :class:`ManusHand` (a (side, points) tuple). Non-finite coordinates are
        passed through: the consumer's skeleton check rejects them.

    Raises:
        ManusSkeletonError: unknown side, ``raw_node_count`` disagreeing with
            the nodes, a repeated node id, an unknown chain type, not exactly
            one ``Hand`` node, a missing finger chain, a chain with fewer than
            four nodes, a chain that branches, or a chain node not reachable
            from the wrist through ``parent_node_id`` (a broken parent link or
            a cycle).
        ConfigurationError: ``glove_to_wrist`` is not a 3x3 orthogonal matrix.
    """
    R = _glove_rotation(glove_to_wrist)
    side = side_label(getattr(glove, "side", None))
    nodes = list(getattr(glove, "raw_nodes", None) or [])
    count = getattr(glove, "raw_node_count", None)
    if count is not None and int(count) != len(nodes):
        raise ManusSkeletonError(f"raw_node_count is {int(count)} but the glove has {len(nodes)} raw nodes")
    if not nodes:
        raise ManusSkeletonError("the glove has no raw nodes")

    by_id: dict[int, Any] = {}
    chain_of: dict[int, str] = {}
    for node in nodes:
        node_id = int(node.node_id)
        if node_id in by_id:
            raise ManusSkeletonError(f"node id {node_id} appears twice")
        label = chain_label(node.chain_type)
        if label is None:
            raise ManusSkeletonError(
                f"node {node_id} has chain type {node.chain_type!r}; expected one of "
                "Hand, Thumb, Index, Middle, Ring, Pinky"
            )
        by_id[node_id] = node
        chain_of[node_id] = label

    wrists = [i for i, c in chain_of.items() if c == HAND_CHAIN]
    if len(wrists) != 1:
        raise ManusSkeletonError(f"expected exactly one node of chain 'Hand' (the wrist), found {len(wrists)}")
    wrist = wrists[0]

    children: dict[int, list[int]] = {}
    for node_id, node in by_id.items():
        if node_id == wrist:
            continue  # the wrist's own parent (itself, -1, another body part) does not matter
        parent = int(node.parent_node_id)
        if parent not in by_id:
            raise ManusSkeletonError(
                f"node {node_id} ({chain_of[node_id]}) has parent {parent}, which is not in the glove"
            )
        children.setdefault(parent, []).append(node_id)

    p_wrist = _position(by_id[wrist])
    points = np.zeros((N_POINTS, 3))
    for f, finger in enumerate(FINGERS):
        members = [i for i, c in chain_of.items() if c == finger]
        if not members:
            raise ManusSkeletonError(f"the glove has no {finger} chain")
        path: list[int] = []
        current = wrist
        while True:
            nxt = [c for c in children.get(current, []) if chain_of[c] == finger]
            if len(nxt) > 1:
                raise ManusSkeletonError(f"the {finger} chain branches at node {current} (children {sorted(nxt)})")
            if not nxt or nxt[0] in path:
                break
            current = nxt[0]
            path.append(current)
        if len(path) != len(members):
            lost = sorted(set(members) - set(path))
            raise ManusSkeletonError(
                f"{finger} node(s) {lost} are not reachable from the wrist {wrist} through parent_node_id "
                "(a broken parent link or a cycle)"
            )
        if len(path) < MIN_CHAIN_NODES:
            raise ManusSkeletonError(
                f"the {finger} chain has {len(path)} node(s); at least {MIN_CHAIN_NODES} are needed"
            )
        for k, node_id in enumerate(path[-MIN_CHAIN_NODES:]):
            points[1 + 4 * f + k] = _position(by_id[node_id]) - p_wrist
    return ManusHand(side, points @ R.T)



@HAND_BACKENDS.register
class ManusGloves(MessageHands):
    """The Manus SDK's ROS 2 publisher: one ``ManusGlove`` message per glove and frame, on ``topics``; the side
    comes from each message (a second topic claiming a side is not used)."""

    name = "manus"
    message_type = "manus_ros2_msgs/msg/ManusGlove"
    message_hint = "the Manus SDK's ROS 2 message package: build it in your workspace and source it"
    SETTINGS = (
        Param("topics", STR_LIST, ["/manus_glove_0", "/manus_glove_1"],
              "ManusGlove topics (the side comes from each message)"),
        Param("glove_to_wrist_rpy", FLOAT_LIST, [0.0, 0.0, 0.0],
              "rotation from the glove skeleton frame to the wrist frame (roll, pitch, yaw)", "rad",
              min=-3.1416, max=3.1416, length=3),
        Param("mirror", bool, False, "the SDK build reports a left-handed frame (mirror y after the rotation)"),
    )
    IO = NodeIO(subscriptions=(
        Topic("{topic}", message_type, SENSOR_DATA, "one glove per message; the side comes from the message",
              each=Each("topic", param="topics")),
    ))

    def __init__(self, topics: list[str], glove_to_wrist: np.ndarray | None = None) -> None:
        """
        Args:
            topics: the ManusGlove topics.
            glove_to_wrist: (3, 3) glove skeleton frame -> wrist frame (a rotation or reflection); None: identity.
        """
        self._topics = list(topics)
        self.glove_to_wrist = _glove_rotation(glove_to_wrist)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: HandContext) -> ManusGloves:
        R = Rotation.from_euler("xyz", settings["glove_to_wrist_rpy"]).as_matrix()
        return cls(settings["topics"], np.diag([1.0, -1.0, 1.0]) @ R if settings["mirror"] else R)

    def topics(self) -> dict[str, str | None]:
        return {topic: None for topic in self._topics}

    def convert(self, topic: str, side: str | None, message: Any) -> tuple[str, np.ndarray]:
        hand = manus_to_mediapipe(message, self.glove_to_wrist)
        return hand.side, hand.points
