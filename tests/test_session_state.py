"""core.session: the operator's view of a session, folded from the nodes' diagnostics (no ROS)."""

from __future__ import annotations

import json

from rynn_teleop.core.session import SessionState


def _state() -> SessionState:
    st = SessionState(stale_after_s=3.0)
    st.on_diagnostics("arm_ik", 0, "following", {"calibrated": "True", "engaged": "True", "left.active": "True",
                                                  "right.active": "False", "command.rate_hz": "199.0",
                                                  "command.nominal_hz": "200", "command.latency_p50_ms": "4.00",
                                                  "command.latency_p99_ms": "8.10", "command.latency_budget_ms": "10"},
                    now=10.0)
    st.on_diagnostics("arm_driver", 2, "e-stop latched", {"estop": "True", "joint_states.rate_hz": "150.0",
                                                         "joint_states.nominal_hz": "200"}, now=10.0)
    st.on_diagnostics("hand_driver", 0, "running", {"estop": "False"}, now=10.0)
    st.on_diagnostics("camera_switch", 0, "forwarding generated", {"active_source": "generated"}, now=10.0)
    st.on_diagnostics("recorder", 0, "recording", {"recording": "True", "episode": "/data/episode_0003",
                                                   "episode_elapsed_s": "12.5", "episode_messages": "4200",
                                                   "episode_problems": "/joint_states: 2 dropped",
                                                   "output_dir": "/data"}, now=10.0)
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
