"""The Marvin arm backend's target stream against a stand-in of the vendor SDK, started as a lab starts it.

    .venv/bin/python bench/marvin_stream.py [--seconds 20]     # about 3 x (seconds + 15) s

A stand-in ``fx_robot.py`` (written into a temporary folder: ``Marvin_Robot`` + ``DCSS`` as the SDK has them)
timestamps every ``subscribe`` (one per driver tick: the driver reads the arms every cycle) and every
``send_cmd`` (one per target actually sent) with ``time.monotonic`` and writes them out when the process
exits. Cases, each on its own ROS domain:

* ``one_process``: ``rynn-teleop run --mode digital --one-process -p arm_driver.backend=marvin`` (the whole
  stack in one interpreter: tracker, IK, world model, camera ... beside the driver);
* ``mode_real``: ``rynn-teleop run --mode real`` (the lab's real mode, one process per process group: the Marvin
  stand-in for the arms; the hands, camera and operator input on their simulated backends, which need no device);
* ``driver_process``: ``rynn-teleop run arm_driver`` alone (as a launch file starts it: a process of its own)
  beside ``rynn-teleop run --mode digital`` without arm_driver in a second process.

Baseline, same run: the driver's own ticks (``subscribe`` calls) over the same window: ``sent_per_tick`` is
sends / ticks (1.0: every cycle's target went out), ``sends_hz`` against ``ticks_hz`` and the expected
``rate_hz``. The first 5 s after the first send (start-up) are not counted. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RYNN = str(ROOT / ".venv" / "bin" / "rynn-teleop")
SETTLE_S = 5.0  # [s] after the first send, not counted
RATE_HZ = 200.0

STAND_IN = '''
"""Stand-in of the Marvin SDK's fx_robot (bench): logs subscribe and send_cmd times to $MARVIN_BENCH_LOG."""
import atexit, json, os, time
_LOG = {"subscribe": [], "send_cmd": []}
_CALLS = open(os.environ["MARVIN_BENCH_CALLS"], "a", buffering=1) if os.environ.get("MARVIN_BENCH_CALLS") else None
def _log_call(name, *args):
    if _CALLS is not None:  # one line per SDK call, as a stand-in that logs each call would
        _CALLS.write(f"{time.time():.6f} {name} {args!r}\\n")
class DCSS:
    pass
class Marvin_Robot:
    def __init__(self):
        self.pos = [[0.0] * 7, [0.0] * 7]
        self.serial = [1, 1]
        self.state = [0, 0]
    def connect(self, ip):
        _log_call('connect', ip)
        return 1
    def subscribe(self, dcss):
        _log_call('subscribe', dcss)
        _LOG["subscribe"].append(time.monotonic())
        self.serial = [s + 1 for s in self.serial]
        return {"states": [{"cur_state": self.state[i], "cmd_state": self.state[i], "err_code": 0} for i in range(2)],
                "outputs": [{"frame_serial": self.serial[i], "fb_joint_pos": list(self.pos[i]),
                             "fb_joint_vel": [0.0] * 7, "fb_joint_cmd": list(self.pos[i]),
                             "fb_joint_cToq": [0.0] * 7, "fb_joint_sToq": [0.0] * 7, "fb_joint_them": [30.0] * 7,
                             "est_joint_force": [0.0] * 7, "est_cart_fn": [0.0] * 6} for i in range(2)]}
    def check_error_and_clear(self, dcss):
        _log_call('check_error_and_clear', dcss)
        pass
    def clear_error(self, arm):
        _log_call('clear_error', arm)
        pass
    def clear_set(self):
        _log_call('clear_set')
        return 1
    def set_state(self, arm, state):
        _log_call('set_state', arm, state)
        self.state["AB".index(arm)] = state
        return 1
    def set_vel_acc(self, arm, vel, acc):
        _log_call('set_vel_acc', arm, vel, acc)
        return 1
    def set_joint_cmd_pose(self, arm, joints):
        _log_call('set_joint_cmd_pose', arm, joints)
        self.pos["AB".index(arm)] = list(joints)
        return 1
    def send_cmd(self):
        _log_call('send_cmd')
        _LOG["send_cmd"].append(time.monotonic())
        return 1
    def soft_stop(self, arm):
        _log_call('soft_stop', arm)
        pass
    def get_servo_error_code(self, arm):
        _log_call('get_servo_error_code', arm)
        return ["0x0"] * 7
    def release_robot(self):
        _log_call('release_robot')
        return 1
def _dump():
    path = os.environ.get("MARVIN_BENCH_LOG")
    if path:
        with open(path, "w") as f:
            json.dump(_LOG, f)
atexit.register(_dump)
'''


def _env(domain: int, log: Path, calls: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_DOMAIN_ID=str(domain), MARVIN_BENCH_LOG=str(log))
    if calls is not None:
        env["MARVIN_BENCH_CALLS"] = str(calls)
    return env


def _run(cases: list[list[str]], env: dict[str, str], seconds: float) -> None:
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True) for args in cases]
    time.sleep(seconds + SETTLE_S + 10.0)  # start-up, settle, window
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def _stats(log: Path, seconds: float) -> dict:
    if not log.exists():
        return {"error": "the driver wrote no log (did it start? is the stand-in SDK found?)"}
    data = json.loads(log.read_text())
    sends, ticks = np.array(data["send_cmd"]), np.array(data["subscribe"])
    if len(sends) < 10:
        return {"error": f"only {len(sends)} sends"}
    t0 = sends[0] + SETTLE_S
    t1 = min(t0 + seconds, sends[-1])
    window = t1 - t0
    s = sends[(sends >= t0) & (sends <= t1)]
    k = ticks[(ticks >= t0) & (ticks <= t1)]
    gaps = np.diff(s) * 1e3
    return {"window_s": round(float(window), 2), "sends_hz": round(len(s) / window, 1),
            "ticks_hz": round(len(k) / window, 1), "sent_per_tick": round(len(s) / max(1, len(k)), 4),
            "gaps_over_20ms": int((gaps > 20).sum()), "gap_p99_ms": round(float(np.percentile(gaps, 99)), 2),
            "gap_max_ms": round(float(gaps.max()), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per case [s]")
    ap.add_argument("--log-calls", action="store_true", help="the stand-in also writes a line per SDK call to a file")
    args = ap.parse_args()
    marvin = ["-p", "arm_driver.backend=marvin"]
    out: dict = {"rate_hz": RATE_HZ, "log_calls": args.log_calls}
    with tempfile.TemporaryDirectory(prefix="marvin_bench_") as tmp:
        sdk = Path(tmp) / "sdk"
        sdk.mkdir()
        (sdk / "fx_robot.py").write_text(STAND_IN)
        (sdk / "libMarvinSDK.so").write_bytes(b"")
        marvin += ["-p", f"arm_driver.marvin.sdk_path={sdk}"]
        base = 60 + os.getpid() % 50
        cases = {
            "one_process": [[RYNN, "run", "--mode", "digital", "--one-process", *marvin]],
            # the lab's real mode, the other devices stood in for by their simulated backends
            "mode_real": [[RYNN, "run", "--mode", "real", "--tracker-backend", "synthetic",
                           "--hand-retarget-backend", "synthetic", "-p", "hand_driver.backend=sim",
                           "-p", "head_camera.backend=synthetic", *marvin]],
            "driver_process": [[RYNN, "run", "arm_driver", *marvin],
                               [RYNN, "run", "tracker", "arm_ik", "hand_retarget", "hand_driver", "head_camera",
                                "world_model", "camera_switch"]],
        }
        for i, (name, procs) in enumerate(cases.items()):
            log = Path(tmp) / f"{name}.json"
            calls = Path(tmp) / f"{name}.calls" if args.log_calls else None
            _run(procs, _env(base + i, log, calls), args.seconds)
            out[name] = _stats(log, args.seconds)
            print(name, out[name], file=sys.stderr, flush=True)
    worst = min((c.get("sent_per_tick", 0.0) for c in out.values() if isinstance(c, dict)), default=0.0)
    out["worst_sent_per_tick"] = worst
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
