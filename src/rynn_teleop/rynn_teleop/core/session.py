"""The state of a teleoperation session, as the operator sees it, from the nodes' diagnostics (ROS-free).

Every node publishes ``/diagnostics`` once a second (``nodes.base.TeleopNode``): a level, a message and
key/value strings. :class:`SessionState` decodes each node's typed status from those (``core.status``: the
same classes the nodes write them with, by node name :data:`~.status.STATUS_OF_NODE`) and folds them, with
the latched active camera source, into what an operator needs: calibrated / engaged / following per arm,
e-stop latched or not and each driver's state (its lifecycle state: unconfigured, inactive or active, and its
safety mode), the active feed, the episode being recorded, the policy acting (when a policy node runs: its state,
rate and inference time), and each node's health (rates against their nominal values, latency percentiles). The
console node and ``rynn-teleop call status`` both read it; neither parses diagnostics itself.

A node whose diagnostics do not hold its status (another version's keys) is shown as such: its health is an
error naming what is missing, and what it would tell reads unknown; nothing is read as a default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .layout import SIDES
from .status import (
    SLOW_SHARE,
    STATUS_OF_NODE,
    ArmIKStatus,
    DriverStatus,
    FeedStatus,
    Meter,
    PolicyStatus,
    RecorderStatus,
    Status,
    StatusError,
    TwinStatus,
    decode_meters,
)

DRIVERS = ("arm_driver", "hand_driver")
POLICY = "policy"  # the policy node's name
POLICY_METER = "act"  # its meter: actions a second, act() time as latency
LEVELS = ("ok", "warn", "error", "stale")  # diagnostic_msgs/DiagnosticStatus levels 0-3, by name
#: a node whose diagnostics are older than this is shown as not running [s] (it publishes at 1 Hz)
STALE_AFTER_S = 3.0
MeterHealth = Meter  # one rate/latency meter of a node (core.status)
__all__ = ["DRIVERS", "LEVELS", "POLICY", "POLICY_METER", "SLOW_SHARE", "STALE_AFTER_S", "MeterHealth", "NodeHealth",
           "SessionState"]
S = TypeVar("S", bound=Status)


@dataclass
class NodeHealth:
    """The newest diagnostics of one node, and its typed status where the node has one."""

    name: str
    level: int  # 0 ok, 1 warn, 2 error, 3 stale (DiagnosticStatus)
    message: str
    values: dict[str, str]
    received: float  # [s] when they arrived (the caller's clock)
    status: Status | None = None  # decoded (STATUS_OF_NODE); None: the node has none, or it is unreadable
    meters: list[Meter] = field(default_factory=list)  # its rate/latency meters, by name
    status_error: str = ""  # why its status or meters could not be read ("" when they could)

    @classmethod
    def decode(cls, name: str, level: int, message: str, values: Mapping[str, str], received: float) -> NodeHealth:
        """The health of node ``name``, its status and meters decoded (a decoding error is kept, not raised)."""
        health = cls(name, int(level), str(message), dict(values), float(received))
        kind = STATUS_OF_NODE.get(name)
        errors = []
        try:
            if kind is not None:
                health.status = kind.decode(health.values)
        except StatusError as exc:
            errors.append(str(exc))
        try:
            health.meters = decode_meters(health.values)
        except StatusError as exc:
            errors.append(str(exc))
        health.status_error = "; ".join(errors)
        return health


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
        self.nodes[name] = NodeHealth.decode(name, level, message, values, now)

    def on_active_source(self, source: str) -> None:
        """The latched active camera source."""
        self.active_source_topic = str(source)

    # ------------------------------------------------------------------ what the operator sees
    def alive(self, name: str, now: float) -> bool:
        """``name`` reported within :attr:`stale_after_s` of ``now`` [s]."""
        node = self.nodes.get(name)
        return node is not None and now - node.received <= self.stale_after_s

    def status(self, name: str, kind: type[S], now: float) -> S | None:
        """Node ``name``'s typed status; None when it is not running or its status is unreadable (then
        :meth:`health` says why)."""
        if not self.alive(name, now):
            return None
        status = self.nodes[name].status
        return status if isinstance(status, kind) else None

    def arms(self, now: float) -> dict[str, dict[str, bool | None]]:
        """Per side: ``calibrated`` (one calibration serves both arms), ``engaged`` (the clutch) and
        ``following`` (engaged and tracked this cycle); None when arm_ik is not running."""
        arm = self.status("arm_ik", ArmIKStatus, now)
        if arm is None:
            return {s: {"calibrated": None, "engaged": None, "following": None} for s in SIDES}
        return {s: {"calibrated": arm.calibrated, "engaged": arm.engaged, "following": arm.following[s]}
                for s in SIDES}

    def drivers(self, now: float) -> dict[str, DriverStatus | None]:
        """Driver -> its status (None: not running, or its status unreadable)."""
        return {d: self.status(d, DriverStatus, now) for d in DRIVERS}

    def estop(self, now: float) -> dict[str, bool | None]:
        """Driver -> e-stop latched (None: the driver is not running)."""
        return {d: None if st is None else st.estop for d, st in self.drivers(now).items()}

    def estop_latched(self, now: float) -> bool:
        """Any running driver is e-stopped."""
        return any(v for v in self.estop(now).values())

    def active_source(self, now: float) -> str:
        """The feed on the consumer topic ("" when unknown)."""
        feed = self.status("camera_switch", FeedStatus, now)
        return feed.active_source if feed is not None else self.active_source_topic

    def episode(self, now: float) -> dict[str, Any]:
        """The recorder: ``running``, ``recording``, ``output_dir``; while recording ``name``, ``path`` (its
        directory), ``elapsed_s``, ``messages``, ``problems``."""
        rec = self.status("recorder", RecorderStatus, now)
        if rec is None:
            return {"running": False, "recording": False}
        out: dict[str, Any] = {"running": True, "recording": rec.recording, "output_dir": rec.output_dir}
        if rec.recording:
            out.update(name=rec.name, path=rec.episode, elapsed_s=rec.elapsed_s, messages=rec.messages,
                       problems=list(rec.problems))
        return out

    def twin(self, now: float) -> dict[str, Any]:
        """The physical twin (digital mode): ``running``; when it runs ``scene``, ``seed``, ``task``, ``outcome``
        (success, failure or undecided), ``reason``, ``sim_time_s``."""
        twin = self.status("twin", TwinStatus, now)
        if twin is None:
            return {"running": False}
        return {"running": True, "scene": twin.scene, "seed": twin.seed, "task": twin.task, "outcome": twin.outcome,
                "reason": twin.reason, "sim_time_s": twin.sim_time_s}

    def policy(self, now: float) -> dict[str, Any]:
        """The policy node: ``running`` (the node runs); when it runs ``state`` (idle, running, holding, estopped,
        error), ``reason``, ``backend``, ``source``, ``fps`` [Hz], ``run``, ``steps``, ``overruns``, ``last_error``,
        ``recording``, and from its meter ``rate_hz`` (actions a second) and ``inference_p50_ms`` /
        ``inference_p99_ms`` (one act() call; None before the first)."""
        policy = self.status(POLICY, PolicyStatus, now)
        if policy is None:
            return {"running": False}
        meter = next((m for m in self.nodes[POLICY].meters if m.name == POLICY_METER), None)
        return {"running": True, "state": policy.state, "reason": policy.reason, "backend": policy.backend,
                "source": policy.source, "fps": policy.fps, "run": policy.run, "steps": policy.steps,
                "overruns": policy.overruns, "last_error": policy.last_error, "recording": policy.recording,
                "rate_hz": meter.rate_hz if meter is not None else 0.0,
                "inference_p50_ms": meter.latency_p50_ms if meter is not None else math.nan,
                "inference_p99_ms": meter.latency_p99_ms if meter is not None else math.nan}

    def health(self, now: float) -> list[dict[str, Any]]:
        """Every node seen: level name (``stale`` when it stopped reporting), message, meters. A node whose
        status (or a meter) cannot be read is an error that says why."""
        out = []
        for name in sorted(self.nodes):
            node = self.nodes[name]
            level = node.level if self.alive(name, now) else 3
            message = node.message
            if node.status_error:
                level = max(level, 2)  # stale (3) stays stale
                message = f"status unreadable: {node.status_error}" + (f" ({message})" if message else "")
            out.append({"name": name, "level": LEVELS[min(max(level, 0), 3)], "message": message,
                        "age_s": round(now - node.received, 1),
                        "meters": [{**m._asdict(), "slow": m.slow, "late": m.late} for m in node.meters]})
        return out

    def snapshot(self, now: float) -> dict[str, Any]:
        """Everything above as plain data (JSON-serialisable; NaN as None)."""
        drivers = {d: None if st is None else {"backend": st.backend, "lifecycle": st.lifecycle,
                                               "lifecycle_error": st.lifecycle_error, "mode": st.mode,
                                               "estop": st.estop, "latched_by": st.latched_by,
                                               "faults": list(st.faults)}
                   for d, st in self.drivers(now).items()}
        return _jsonable({"arms": self.arms(now), "estop": self.estop(now), "estop_latched": self.estop_latched(now),
                          "drivers": drivers, "active_source": self.active_source(now), "episode": self.episode(now),
                          "twin": self.twin(now), "policy": self.policy(now), "nodes": self.health(now)})

    def summary(self, now: float) -> str:
        """A few lines for a terminal (``rynn-teleop call status``)."""
        lines = []
        for side, arm in self.arms(now).items():
            lines.append(f"{side} arm: calibrated {_word(arm['calibrated'])}, engaged {_word(arm['engaged'])}, "
                         f"following {_word(arm['following'])}")
        estop = self.estop(now)
        lines.append("e-stop: " + ", ".join(f"{d} {'LATCHED' if v else ('released' if v is False else 'not running')}"
                                           for d, v in estop.items()))
        drivers = [f"{d} {st.backend} {st.lifecycle} ({st.mode}"
                   + (f"; {st.lifecycle_error}" if st.lifecycle_error else "")
                   + (f"; latched by {st.latched_by}" if st.latched_by else "")
                   + (f"; faults: {'; '.join(st.faults)}" if st.faults else "") + ")"
                   for d, st in self.drivers(now).items() if st is not None]
        if drivers:
            lines.append("drivers: " + ", ".join(drivers))
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
        twin = self.twin(now)
        if twin["running"]:
            lines.append(f"twin: {twin['scene']} (seed {twin['seed']}), {twin['task']}: {twin['outcome']} "
                         f"({twin['reason']})")
        policy = self.policy(now)
        if policy["running"]:
            timing = (f", act() p50 {policy['inference_p50_ms']:.1f} / p99 {policy['inference_p99_ms']:.1f} ms"
                      if not math.isnan(policy["inference_p50_ms"]) else "")
            lines.append(f"policy: {policy['state']}" + (f" ({policy['reason']})" if policy["reason"] else "")
                         + f"; {policy['backend']}: {policy['source']}; run {policy['run']}, {policy['steps']} steps, "
                         f"{policy['rate_hz']:.1f} / {policy['fps']:g} Hz{timing}, {policy['overruns']} overruns"
                         + (", recorded" if policy["recording"] else "")
                         + (f"; last error: {policy['last_error']}" if policy["last_error"] else ""))
        unreadable = [f"{n.name}: {n.status_error}" for n in self.nodes.values()
                      if n.status_error and self.alive(n.name, now)]
        lines += [f"status unreadable: {u}" for u in unreadable]
        return "\n".join(lines)


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
