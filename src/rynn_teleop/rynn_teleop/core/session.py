"""The state of a teleoperation session, as the operator sees it, from the nodes' diagnostics (ROS-free).

Every node publishes ``/diagnostics`` once a second (``nodes.base.TeleopNode``): a level, a message and
key/value strings. :class:`SessionState` folds those (and the latched active camera source) into what an
operator needs: calibrated / engaged per arm, e-stop latched or not, the active feed, the episode being
recorded, and each node's health (rates against their nominal values, latency percentiles). The console
node and ``rynn-teleop call status`` both read it; neither parses diagnostics itself.

Keys read (written by the nodes): ``arm_ik``: ``calibrated``, ``engaged``, ``<side>.active``;
``arm_driver`` / ``hand_driver``: ``estop``, ``latched_by``; ``camera_switch``: ``active_source``;
``recorder``: ``recording``, ``episode``, ``episode_elapsed_s``, ``episode_messages``,
``episode_problems``, ``output_dir``; every node: ``<meter>.rate_hz``, ``<meter>.nominal_hz``,
``<meter>.latency_p50_ms``, ``<meter>.latency_p99_ms``, ``<meter>.latency_budget_ms``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .layout import SIDES

DRIVERS = ("arm_driver", "hand_driver")
LEVELS = ("ok", "warn", "error", "stale")  # diagnostic_msgs/DiagnosticStatus levels 0-3, by name
#: a node whose diagnostics are older than this is shown as not running [s] (it publishes at 1 Hz)
STALE_AFTER_S = 3.0
#: a meter below this share of its nominal rate is flagged slow
SLOW_SHARE = 0.9


class MeterHealth(NamedTuple):
    """One rate/latency meter of a node."""

    name: str
    rate_hz: float  # measured [Hz]
    nominal_hz: float  # [Hz] what it should show; NaN when the node does not say
    latency_p50_ms: float  # [ms]; NaN when the meter has no latency
    latency_p99_ms: float  # [ms]
    latency_budget_ms: float  # [ms] the p99 it should stay under; NaN when the node does not say

    @property
    def slow(self) -> bool:
        """Below :data:`SLOW_SHARE` of its nominal rate."""
        return not math.isnan(self.nominal_hz) and self.rate_hz < SLOW_SHARE * self.nominal_hz

    @property
    def late(self) -> bool:
        """Its p99 latency is over its budget."""
        return not math.isnan(self.latency_budget_ms) and self.latency_p99_ms > self.latency_budget_ms


@dataclass
class NodeHealth:
    """The newest diagnostics of one node."""

    name: str
    level: int  # 0 ok, 1 warn, 2 error, 3 stale (DiagnosticStatus)
    message: str
    values: dict[str, str]
    received: float  # [s] when they arrived (the caller's clock)

    def meters(self) -> list[MeterHealth]:
        """The node's meters, by name."""
        names = sorted(k[: -len(".rate_hz")] for k in self.values if k.endswith(".rate_hz"))
        v = self.values
        return [MeterHealth(n, _float(v.get(f"{n}.rate_hz")), _float(v.get(f"{n}.nominal_hz")),
                            _float(v.get(f"{n}.latency_p50_ms")), _float(v.get(f"{n}.latency_p99_ms")),
                            _float(v.get(f"{n}.latency_budget_ms")))
                for n in names]


@dataclass
class SessionState:
    """What the operator needs to know, updated from diagnostics and the latched active source.

    Not thread-safe: feed and read it from one thread, or guard it.
    """

    stale_after_s: float = STALE_AFTER_S
    nodes: dict[str, NodeHealth] = field(default_factory=dict)
    active_source_topic: str = ""  # the latched /head_camera/active_source value ("" until received)

    # ------------------------------------------------------------------ input
    def on_diagnostics(self, name: str, level: int, message: str, values: Mapping[str, str], now: float) -> None:
        """One node's status at ``now`` [s]."""
        self.nodes[name] = NodeHealth(name, int(level), str(message), dict(values), float(now))

    def on_active_source(self, source: str) -> None:
        """The latched active camera source."""
        self.active_source_topic = str(source)

    # ------------------------------------------------------------------ what the operator sees
    def alive(self, name: str, now: float) -> bool:
        """``name`` reported within :attr:`stale_after_s` of ``now`` [s]."""
        node = self.nodes.get(name)
        return node is not None and now - node.received <= self.stale_after_s

    def _value(self, node: str, key: str, now: float) -> str | None:
        return self.nodes[node].values.get(key) if self.alive(node, now) else None

    def arms(self, now: float) -> dict[str, dict[str, bool | None]]:
        """Per side: ``calibrated`` (one calibration serves both arms), ``engaged`` (the clutch) and
        ``following`` (engaged and tracked this cycle); None when arm_ik is not running."""
        calibrated = _bool(self._value("arm_ik", "calibrated", now))
        engaged = _bool(self._value("arm_ik", "engaged", now))
        return {s: {"calibrated": calibrated, "engaged": engaged,
                    "following": _bool(self._value("arm_ik", f"{s}.active", now))} for s in SIDES}

    def estop(self, now: float) -> dict[str, bool | None]:
        """Driver -> e-stop latched (None: the driver is not running)."""
        return {d: _bool(self._value(d, "estop", now)) for d in DRIVERS}

    def estop_latched(self, now: float) -> bool:
        """Any running driver is e-stopped."""
        return any(v for v in self.estop(now).values())

    def active_source(self, now: float) -> str:
        """The feed on the consumer topic ("" when unknown)."""
        return self._value("camera_switch", "active_source", now) or self.active_source_topic

    def episode(self, now: float) -> dict[str, Any]:
        """The recorder: ``running``, ``recording``, ``name``, ``elapsed_s``, ``messages``, ``problems``,
        ``output_dir``."""
        if not self.alive("recorder", now):
            return {"running": False, "recording": False}
        v = self.nodes["recorder"].values
        recording = _bool(v.get("recording")) is True
        out: dict[str, Any] = {"running": True, "recording": recording, "output_dir": v.get("output_dir", "")}
        if recording:
            problems = v.get("episode_problems", "")
            out.update(name=v.get("episode", "").rsplit("/", 1)[-1], path=v.get("episode", ""),
                       elapsed_s=_float(v.get("episode_elapsed_s")), messages=int(_float(v.get("episode_messages"), 0)),
                       problems=[p for p in problems.split("; ") if p])
        return out

    def health(self, now: float) -> list[dict[str, Any]]:
        """Every node seen: level name (``stale`` when it stopped reporting), message, meters."""
        out = []
        for name in sorted(self.nodes):
            node = self.nodes[name]
            level = node.level if self.alive(name, now) else 3
            out.append({"name": name, "level": LEVELS[min(max(level, 0), 3)], "message": node.message,
                        "age_s": round(now - node.received, 1),
                        "meters": [{**m._asdict(), "slow": m.slow, "late": m.late} for m in node.meters()]})
        return out

    def snapshot(self, now: float) -> dict[str, Any]:
        """Everything above as plain data (JSON-serialisable; NaN as None)."""
        return _jsonable({"arms": self.arms(now), "estop": self.estop(now), "estop_latched": self.estop_latched(now),
                          "active_source": self.active_source(now), "episode": self.episode(now),
                          "nodes": self.health(now)})

    def summary(self, now: float) -> str:
        """A few lines for a terminal (``rynn-teleop call status``)."""
        lines = []
        for side, arm in self.arms(now).items():
            lines.append(f"{side} arm: calibrated {_word(arm['calibrated'])}, engaged {_word(arm['engaged'])}, "
                         f"following {_word(arm['following'])}")
        estop = self.estop(now)
        lines.append("e-stop: " + ", ".join(f"{d} {'LATCHED' if v else ('released' if v is False else 'not running')}"
                                           for d, v in estop.items()))
        lines.append(f"camera feed: {self.active_source(now) or 'unknown (camera_switch not running)'}")
        ep = self.episode(now)
        if not ep["running"]:
            lines.append("episode: recorder not running")
        elif ep["recording"]:
            problems = "; ".join(ep["problems"]) or "none"
            lines.append(f"episode: recording {ep['name']} ({ep['elapsed_s']:.1f} s, {ep['messages']} messages; "
                         f"problems: {problems})")
        else:
            lines.append(f"episode: not recording (output {ep['output_dir']})")
        return "\n".join(lines)


def _float(text: str | None, default: float = math.nan) -> float:
    try:
        return float(text) if text not in (None, "") else default
    except ValueError:
        return default


def _bool(text: str | None) -> bool | None:
    return None if text is None else text.strip().lower() == "true"


def _word(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 3)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
