"""What the ROS graph tells about a topic a node subscribes to without knowing it in advance (recorder, foxglove).

Both take types and QoS from the topic's publishers: a subscription must match every publisher (a best-effort
camera, a latched state topic), and its message class comes from the type name the graph reports.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from ..recording import TopicQos


def message_class(type_name: str) -> Any:
    """The rclpy message class of ``pkg/msg/Name``; ImportError/AttributeError when not installed, ValueError
    for a name that is not a message type."""
    package, kind, name = type_name.split("/")
    if kind != "msg":
        raise ValueError(type_name)
    return getattr(importlib.import_module(f"{package}.msg"), name)


def subscription_qos(
    infos: Any, rate_hz: float | None = None, queue_s: float = 1.0
) -> tuple[QoSProfile, list[TopicQos]]:
    """A QoS matching every publisher in ``infos`` (``get_publishers_info_by_topic``; best effort if any is,
    transient local only if all are), and the publishers' own.

    Its queue holds ``queue_s`` [s] of messages at ``rate_hz`` [Hz] (at least 100): what arrives while the
    node cannot drain (a starved process) waits there instead of being overwritten."""
    offered = [TopicQos("best_effort" if i.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT else "reliable",
                        "transient_local" if i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL
                        else "volatile", int(i.qos_profile.depth) or 10) for i in infos]
    best_effort = any(q.reliability == "best_effort" for q in offered)
    transient = bool(offered) and all(q.durability == "transient_local" for q in offered)
    qos = QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=max(100, math.ceil((rate_hz or 0.0) * queue_s)),
        reliability=ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if transient else DurabilityPolicy.VOLATILE,
    )
    return qos, offered
