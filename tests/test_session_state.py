"""core.session: the operator's view of a session, folded from the nodes' diagnostics (no ROS).

The diagnostics are written here as the nodes write them: with the typed statuses of ``core.status``."""

from __future__ import annotations

import dataclasses
import json

from rynn_teleop.core.session import SessionState
from rynn_teleop.core.status import (
    ArmIKStatus,
    Count,
    DriverStatus,
    FeedStatus,
    Meter,
    RecorderStatus,
    encode_meters,
)


def driver(estop: bool, **kw) -> dict[str, str]:
    return DriverStatus(**{"backend": "sim", "mode": "estop" if estop else "track", "estop": estop,
                           "latched_by": "", "faults": (), "lifecycle": "active", "lifecycle_error": "", **kw}).encode()


def _state() -> SessionState:
    st = SessionState(stale_after_s=3.0)
    arm = ArmIKStatus(calibrated=True, engaged=True, started=True, following={"left": True, "right": False})
    st.on_diagnostics("arm_ik", 0, "following", {**arm.values({"cycles": 12}), **encode_meters(
        [Meter("command", 199.0, 200.0, 4.0, 8.1, 10.0)])}, now=10.0)
    st.on_diagnostics("arm_driver", 2, "e-stop latched", {**driver(True), **encode_meters(
        [Meter("joint_states", 150.0, 200.0)])}, now=10.0)
    st.on_diagnostics("hand_driver", 0, "running", driver(False), now=10.0)
    st.on_diagnostics("camera_switch", 0, "forwarding generated",
                      FeedStatus("generated", "generated", False).encode(), now=10.0)
    st.on_diagnostics("recorder", 0, "recording", RecorderStatus(
        recording=True, episode="/data/episode_0003", output_dir="/data", elapsed_s=12.5, messages=4200,
        problems=("/joint_states: 2 dropped",), topics_subscribed=Count(12, 12), topics_flowing=Count(9, 9),
        failure="").encode(), now=10.0)
    return st


def test_arms_estop_feed_and_episode_from_diagnostics():
    st = _state()
    assert st.arms(10.5) == {"left": {"calibrated": True, "engaged": True, "following": True},
                             "right": {"calibrated": True, "engaged": True, "following": False}}
    assert st.estop(10.5) == {"arm_driver": True, "hand_driver": False}
    assert st.estop_latched(10.5)
    assert st.active_source(10.5) == "generated"
    ep = st.episode(10.5)
    assert ep["recording"] and ep["name"] == "episode_0003" and ep["messages"] == 4200
    assert ep["elapsed_s"] == 12.5 and ep["problems"] == ["/joint_states: 2 dropped"]


def test_meters_against_their_nominal_rates():
    health = {n["name"]: n for n in _state().health(10.5)}
    (command,) = health["arm_ik"]["meters"]
    assert command["rate_hz"] == 199.0 and command["nominal_hz"] == 200.0 and not command["slow"]
    assert command["latency_p99_ms"] == 8.1 and command["latency_budget_ms"] == 10.0 and not command["late"]
    (joint_states,) = health["arm_driver"]["meters"]
    assert joint_states["slow"] and not joint_states["late"]  # 150 of 200 Hz; no latency budget
    assert health["arm_driver"]["level"] == "error"


def test_a_silent_node_is_stale_and_its_state_unknown():
    st = _state()
    later = 10.0 + 3.5
    assert st.arms(later)["left"] == {"calibrated": None, "engaged": None, "following": None}
    assert st.estop(later) == {"arm_driver": None, "hand_driver": None} and not st.estop_latched(later)
    assert st.episode(later) == {"running": False, "recording": False}
    assert all(n["level"] == "stale" for n in st.health(later))
    st.on_active_source("physical")  # the latched topic still tells the feed
    assert st.active_source(later) == "physical"


def test_snapshot_is_json_and_summary_readable():
    st = _state()
    doc = json.loads(json.dumps(st.snapshot(10.5)))
    assert doc["estop_latched"] is True and doc["active_source"] == "generated"
    text = st.summary(10.5)
    assert "left arm: calibrated yes, engaged yes, following yes" in text
    assert "arm_driver LATCHED" in text and "hand_driver released" in text
    assert "recording episode_0003 (12.5 s, 4200 messages; problems: /joint_states: 2 dropped)" in text
    empty = SessionState().summary(0.0)
    assert "recorder not running" in empty and "camera_switch not running" in empty


def test_drivers_state_in_the_snapshot_and_the_summary():
    st = _state()
    st.on_diagnostics("arm_driver", 2, "e-stop latched", driver(True, latched_by="backend fault: overcurrent J3",
                                                               faults=("overcurrent J3",)), now=10.0)
    doc = st.snapshot(10.5)
    assert doc["drivers"]["arm_driver"] == {"backend": "sim", "lifecycle": "active", "lifecycle_error": "",
                                            "mode": "estop", "estop": True,
                                            "latched_by": "backend fault: overcurrent J3", "faults": ["overcurrent J3"]}
    assert doc["drivers"]["hand_driver"]["mode"] == "track"
    text = st.summary(10.5)
    assert "arm_driver sim active (estop; latched by backend fault: overcurrent J3; faults: overcurrent J3)" in text


def test_each_drivers_lifecycle_state_and_why_a_transition_failed():
    st = _state()
    error = "configure failed: marvin: sdk_path '' is not a folder"
    st.on_diagnostics("arm_driver", 2, error, driver(False, lifecycle="unconfigured", lifecycle_error=error,
                                                     mode="waiting"), now=10.0)
    st.on_diagnostics("hand_driver", 1, "inactive", driver(False, lifecycle="inactive", mode="waiting"), now=10.0)
    doc = st.snapshot(10.5)
    assert doc["drivers"]["arm_driver"]["lifecycle"] == "unconfigured"
    assert doc["drivers"]["arm_driver"]["lifecycle_error"] == error
    assert doc["drivers"]["hand_driver"]["lifecycle"] == "inactive"
    text = st.summary(10.5)
    assert f"arm_driver sim unconfigured (waiting; {error})" in text and "hand_driver sim inactive (waiting)" in text


def test_a_status_the_reader_cannot_read_is_shown_as_an_error_not_read_as_a_default():
    """A node of another version (a key renamed): its state reads unknown and its health says what is missing."""
    st = _state()
    values = DriverStatus("sim", "track", True, "", (), "active", "").encode()
    values["estopped"] = values.pop("estop")  # a renamed key
    st.on_diagnostics("arm_driver", 0, "running", values, now=10.0)
    assert st.estop(10.5)["arm_driver"] is None  # unknown, never "released"
    (health,) = [n for n in st.health(10.5) if n["name"] == "arm_driver"]
    assert health["level"] == "error" and "'estop'" in health["message"] and "estopped" in health["message"]
    assert "status unreadable: arm_driver" in st.summary(10.5)
    st.on_diagnostics("camera_switch", 0, "running", {"active_source": "physical"}, now=10.0)  # keys missing
    assert st.active_source(10.5) == ""  # unknown (no latched topic value either)


def test_the_policy_its_state_rate_and_inference_time():
    from rynn_teleop.core.status import PolicyStatus

    st = _state()
    assert st.policy(10.5) == {"running": False} and st.snapshot(10.5)["policy"] == {"running": False}
    assert "policy:" not in st.summary(10.5)  # no policy node: nothing said
    status = PolicyStatus(state="holding", reason="the physical camera frame is 0.62 s old", backend="lerobot",
                          source="/runs/act/pretrained_model", fps=30.0, run=2, steps=412, overruns=3, last_error="",
                          recording=True)
    st.on_diagnostics("policy", 1, "holding", {**status.values({"holds": 1}), **encode_meters(
        [Meter("act", 29.5, 30.0, 11.2, 38.7, 33.3)])}, now=10.0)
    policy = st.policy(10.5)
    assert policy["state"] == "holding" and policy["run"] == 2 and policy["steps"] == 412 and policy["recording"]
    assert (policy["rate_hz"], policy["inference_p50_ms"], policy["inference_p99_ms"]) == (29.5, 11.2, 38.7)
    doc = json.loads(json.dumps(st.snapshot(10.5)))
    assert doc["policy"]["source"] == "/runs/act/pretrained_model" and doc["policy"]["overruns"] == 3
    text = st.summary(10.5)
    assert ("policy: holding (the physical camera frame is 0.62 s old); lerobot: /runs/act/pretrained_model; run 2, "
            "412 steps, 29.5 / 30 Hz, act() p50 11.2 / p99 38.7 ms, 3 overruns, recorded") in text
    # before its first act(): no inference time yet (None in the snapshot, not a default)
    idle = dataclasses.replace(status, state="idle")
    st.on_diagnostics("policy", 0, "idle", {**idle.values(), **encode_meters([Meter("act", 0.0, 30.0)])}, now=10.0)
    assert json.loads(json.dumps(st.snapshot(10.5)))["policy"]["inference_p99_ms"] is None
    assert st.policy(14.0) == {"running": False}  # silent: not running
