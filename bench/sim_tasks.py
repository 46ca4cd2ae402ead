"""The scripted operator doing the twin's tasks through the whole stack, and each recorded episode replayed.

    .venv/bin/python bench/sim_tasks.py [--tasks pick_place,bimanual_lift] [--seeds 0-19] [--no-replay]
                                        [--stale-timeout-s 1.5]     # about 28 minutes here

Per task one stack, as the launch file and the demo run it: the digital mode's nodes with the recorder (the twin with
the task's scene and the drivers' sim backend on it, the synthetic tracker and glove with ``synthetic.task: twin``,
arm_ik with auto-calibration and auto-engage, hand retargeting, the head camera drawing the twin, the world model, the
feed switch, the recorder; robot_markers, which only feeds RViz, left out as the demo does), one ``rynn-teleop run
--mode digital ... NODES`` process per process group of the bringup table (one process for all would share one
interpreter lock: on a 2-core machine the camera's and the world model's frames then delay the 200 Hz control loops by
tens of milliseconds, the trackers go stale and arm_ik re-anchors). The twin starts at a layout (seed 100000), which the
operator does not play (it plays the layout of each reset); the operator, holding the calibration posture, is calibrated
again (``/arm_ik/calibrate``, ``/arm_ik/set_clutch``; arm_ik's auto-calibration at start-up can catch it moving on a
loaded machine). Then, for each seed, this script sets the twin's ``seed`` parameter (a reset to that layout, the robot
back at home), starts an episode (``/recorder/start_episode``), waits while the operator plays the plan (it follows
``/twin/scene``: ``task_delay_s`` after the reset, the plan's duration, a settling time) and stops the episode; the
recorder writes the twin's outcome into ``episode.yaml``. Success is the twin's ``/twin/outcome`` at the stop (the
task's predicate on the physics state), never the script's.

Then every recorded episode is replayed on a fresh twin (``rynn-teleop episodes replay EPISODE --twin --json``:
its scene and layout from the episode, the recorded arm and hand commands through the drivers' safety layer),
one process per episode, and its outcome compared with the recorded one.

Host stalls: on a shared 2-core VM a process may stop for a while; with arm_ik's default ``stale_timeout_s`` (0.1 s)
a stall longer than that makes arm_ik brake and, when the frames resume, re-anchor its clutch while the arm lags
(that episode may miss; the operator takes the offset out at the next episode). ``--stale-timeout-s 1.5`` makes
arm_ik ride through such stalls. Measured at the default since the node processes keep numpy's BLAS to one thread
(an OpenBLAS worker at real-time priority had been spinning, stalling whole CPUs for up to a second): 20/20 and
20/20, replays 20/20 and 20/20.

Time on this 2-core VM: about 8 s of start-up, 19 s per seed through the stack and 23 s per replay, about 14
minutes per task. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("pick_place", "bimanual_lift")
DELAY_S = 2.0  # [s] synthetic.task_delay_s: the operator starts this long after each reset
SETTLE_S = 1.5  # [s] after the plan's end, before the episode is stopped and judged
EXTRA_WAIT_S = 4.0  # [s] longest further wait for the outcome to turn to success after that
START_TIMEOUT_S = 240.0  # [s] for the stack to come up and arm_ik to engage
DUMMY_SEED = 100_000  # the twin's layout at start (the operator does not play a start-up layout)


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def plan_duration(scene: str, seed: int) -> float:
    """[s] the operator's plan for that layout (what the sources play)."""
    import numpy as np

    from rynn_teleop.core.arm_teleop import DEFAULT_HOME
    from rynn_teleop.core.robot_model import RobotModel
    from rynn_teleop.sim.operator_io import home_wrists, plan_for

    return plan_for(scene, seed, home_wrists(RobotModel.default(), np.asarray(DEFAULT_HOME))).duration


class Observer:
    """This script's node on the stack's domain: the twin's scene and outcome, arm_ik's engagement, the
    recorder's episode; the services and parameters it calls."""

    def __init__(self, domain_id: int) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from std_msgs.msg import Bool, String

        from rynn_teleop.core.node_io import LATCHED
        from rynn_teleop.nodes.io import qos_profile

        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node("sim_tasks_bench", context=self.context)
        self.lock = threading.Lock()
        self.scene: dict | None = None
        self.scene_time = 0.0
        self.outcome: dict | None = None
        self.engaged = False
        self.episode = ""
        latched = qos_profile(LATCHED)
        self.node.create_subscription(String, "/twin/scene", self._on_scene, latched)
        self.node.create_subscription(String, "/twin/outcome", self._on_outcome, latched)
        self.node.create_subscription(Bool, "/arm_ik/engaged", self._on_engaged, latched)
        self.node.create_subscription(String, "/recorder/episode", self._on_episode, latched)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # noqa: BLE001 - shutting down
            pass

    def _on_scene(self, msg) -> None:
        with self.lock:
            self.scene, self.scene_time = json.loads(msg.data), time.monotonic()

    def _on_outcome(self, msg) -> None:
        with self.lock:
            self.outcome = json.loads(msg.data)

    def _on_engaged(self, msg) -> None:
        self.engaged = bool(msg.data)

    def _on_episode(self, msg) -> None:
        self.episode = msg.data

    def wait_for_feed(self, topic: str, timeout: float) -> bool:
        """Whether a frame arrived on ``topic`` (the camera feed the recorder records) within ``timeout`` [s]; the
        subscription is dropped after the first frame (the frames are large and not needed here)."""
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import Image

        got = threading.Event()
        sub = self.node.create_subscription(Image, topic, lambda msg: got.set(), qos_profile_sensor_data)
        try:
            return got.wait(timeout)
        finally:
            self.node.destroy_subscription(sub)

    def wait(self, condition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.05)
        return condition()

    def call(self, srv_type, name: str, request, timeout: float = 20.0):
        client = self.node.create_client(srv_type, name)
        try:
            if not client.wait_for_service(timeout_sec=timeout):
                raise RuntimeError(f"service {name} not available")
            future = client.call_async(request)
            if not self.wait(future.done, timeout):
                raise RuntimeError(f"service {name} did not answer")
            return future.result()
        finally:
            self.node.destroy_client(client)

    def trigger(self, name: str) -> str:
        from std_srvs.srv import Trigger

        response = self.call(Trigger, name, Trigger.Request())
        if not response.success:
            raise RuntimeError(f"{name}: {response.message}")
        return response.message

    def engage(self) -> None:
        from std_srvs.srv import SetBool

        response = self.call(SetBool, "/arm_ik/set_clutch", SetBool.Request(data=True))
        if not response.success:
            raise RuntimeError(f"/arm_ik/set_clutch: {response.message}")

    def set_seed(self, seed: int) -> None:
        from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
        from rcl_interfaces.srv import SetParameters

        value = ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=seed)
        request = SetParameters.Request(parameters=[Parameter(name="seed", value=value)])
        result = self.call(SetParameters, "/twin/set_parameters", request).results[0]
        if not result.successful:
            raise RuntimeError(f"twin seed {seed}: {result.reason}")

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.context.try_shutdown()


def stack_groups() -> tuple[tuple[str, ...], ...]:
    """The digital mode's nodes with the recorder, in the bringup's process groups (robot_markers left out)."""
    from rynn_teleop import bringup

    nodes = [n for n in bringup.mode_nodes(record=True, mode="digital") if n != "robot_markers"]
    return bringup.process_groups(nodes)


def start_stack(task: str, out: Path, env: dict, arm_ik: dict,
                extra_args: tuple[str, ...] = (), node_params: dict | None = None) -> list[subprocess.Popen]:
    """One ``rynn-teleop run --mode digital`` process per group (logs ``out/<task>.<group>.log``); ``arm_ik``:
    parameter overrides of that node; ``extra_args``: further ``run`` arguments for every group (``--camera
    physical``); ``node_params``: node -> {key: value} overrides, given to the group that runs the node."""
    operator = {node: {"synthetic.task": "twin", "synthetic.task_delay_s": DELAY_S}
                for node in ("tracker", "hand_retarget")}
    arm_ik = {"calibration_file": str(out / f"{task}.calibration.yaml"), **arm_ik}  # not the user's file
    params = {"twin": {"scene": task, "seed": DUMMY_SEED}, "arm_ik": arm_ik,
              "recorder": {"output_dir": str(out / task), "task": task}, **operator}
    for node, values in (node_params or {}).items():
        params[node] = {**params.get(node, {}), **values}
    procs = []
    for group in stack_groups():
        cmd = [str(Path(sys.executable).parent / "rynn-teleop"), "run", "--mode", "digital",  # auto-calibration
               "--tracker-backend", "synthetic", "--hand-retarget-backend", "synthetic", *extra_args, *group]
        for node in group:
            for key, value in params.get(node, {}).items():
                cmd += ["-p", f"{node}.{key}={value}"]
        log = (out / f"{task}.{'+'.join(group)}.log").open("w")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                      cwd=ROOT))
        log.close()
    return procs


def stop_stack(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_stack(task: str, seeds: list[int], out: Path, domain_id: int, log, arm_ik: dict,
              extra_args: tuple[str, ...] = (), node_params: dict | None = None) -> dict:
    """One stack for ``task``: every seed recorded and judged by the twin (``extra_args``, ``node_params``: see
    start_stack)."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain_id), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    t_start = time.monotonic()
    procs = start_stack(task, out, env, arm_ik, extra_args, node_params)
    obs = Observer(domain_id)
    results = []
    try:
        dead = lambda: any(p.poll() is not None for p in procs)  # noqa: E731
        if not obs.wait(lambda: obs.engaged or dead(), START_TIMEOUT_S) or not obs.engaged:
            raise RuntimeError(f"the stack did not engage within {START_TIMEOUT_S:.0f} s (logs: {out})")
        startup = time.monotonic() - t_start
        # calibrate again, the operator holding the posture now: on a loaded machine arm_ik's auto-calibration at
        # start-up may have caught it moving already (a few cm of fit residual, every target off)
        log(f"{task}: stack engaged after {startup:.1f} s; {obs.trigger('/arm_ik/calibrate')}")
        obs.engage()
        if not obs.wait(lambda: obs.engaged, 10.0):
            raise RuntimeError("arm_ik did not engage after the calibration")
        # the recorded feed must flow before the first episode: a world model backend may still be loading
        from rynn_teleop.recording.frames import FEED_TOPICS

        if not obs.wait_for_feed(FEED_TOPICS["consumer"], START_TIMEOUT_S):
            raise RuntimeError(f"no frame on {FEED_TOPICS['consumer']} within {START_TIMEOUT_S:.0f} s (logs: {out})")
        for seed in seeds:
            t_seed = time.monotonic()
            before = obs.scene_time
            obs.set_seed(seed)
            if not obs.wait(lambda s=seed, b=before: obs.scene_time > b and obs.scene.get("seed") == s, 10.0):
                raise RuntimeError(f"the twin did not publish layout {seed}")
            time.sleep(0.2)  # the recorder has the new scene (its episode's extra.twin)
            obs.trigger("/recorder/start_episode")
            episode = obs.episode
            end = obs.scene_time + DELAY_S + plan_duration(task, seed) + SETTLE_S
            obs.wait(lambda: False, max(0.0, end - time.monotonic()))
            obs.wait(lambda: (obs.outcome or {}).get("success") is True, EXTRA_WAIT_S)
            with obs.lock:
                outcome = dict(obs.outcome or {})
            obs.trigger("/recorder/stop_episode")
            results.append({"seed": seed, "success": outcome.get("success") is True,
                            "reason": outcome.get("reason"), "episode": episode,
                            "wall_s": round(time.monotonic() - t_seed, 1)})
            log(f"{task} seed {seed}: {'success' if results[-1]['success'] else 'failure'} ({outcome.get('reason')})")
    finally:
        obs.close()
        stop_stack(procs)
    return {"episodes": results, "startup_s": round(startup, 1), "wall_s": round(time.monotonic() - t_start, 1)}


def replay(episode: str, domain_id: int) -> dict:
    """``rynn-teleop episodes replay EPISODE --twin --json`` in its own process: its result line."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain_id), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    cmd = [str(Path(sys.executable).parent / "rynn-teleop"), "episodes", "replay", episode, "--twin", "--json"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"error": (proc.stderr or proc.stdout).strip()[-300:]}
    result["exit_code"] = proc.returncode
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS), help="scenes (config/sim), comma separated")
    parser.add_argument("--seeds", default="0-19", help="layouts per task, e.g. 0-19 or 0,3,5")
    parser.add_argument("--no-replay", action="store_true", help="skip replaying the recorded episodes")
    parser.add_argument("--stale-timeout-s", type=float, default=None,
                        help="arm_ik's stale_timeout_s (default: config/arm_ik.yaml's): how long a pause of the "
                        "tracker frames may last before arm_ik brakes and, when they resume, re-anchors its clutch")
    parser.add_argument("--out", default=None, help="where the episodes and logs go (default: a temporary folder, "
                        "removed after a complete run: about 0.4 GB an episode, 17 GB for the default run)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder after a complete run")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # the stack is stopped on the way out
    out = Path(args.out or tempfile.mkdtemp(prefix="sim_tasks_"))
    out.mkdir(parents=True, exist_ok=True)
    seeds = parse_seeds(args.seeds)
    base_domain = 100 + os.getpid() % 50

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    arm_ik = {} if args.stale_timeout_s is None else {"stale_timeout_s": args.stale_timeout_s}
    summary: dict = {"seeds": args.seeds, "task_delay_s": DELAY_S, "arm_ik": arm_ik, "out": str(out)}
    for i, task in enumerate(args.tasks.split(",")):
        run = run_stack(task, seeds, out, base_domain + i, log, arm_ik)
        episodes = run["episodes"]
        successes = sum(e["success"] for e in episodes)
        entry: dict = {"episodes": len(episodes), "successes": successes,
                       "success_rate": round(successes / max(len(episodes), 1), 3),
                       "failures": [{k: e[k] for k in ("seed", "reason")} for e in episodes if not e["success"]],
                       "stack_startup_s": run["startup_s"], "stack_wall_s": run["wall_s"]}
        if not args.no_replay:
            same = replayed_ok = 0
            mismatches = []
            t_replay = time.monotonic()
            for k, e in enumerate(episodes):
                r = replay(e["episode"], base_domain + 10 + k % 20)
                success = (r.get("outcome") or {}).get("success") is True
                replayed_ok += success
                same += success == e["success"]
                if success != e["success"]:
                    mismatches.append({"seed": e["seed"], "recorded": e["success"], "replayed": success,
                                       "reason": (r.get("outcome") or {}).get("reason") or r.get("error")})
                log(f"{task} seed {e['seed']} replay: {'success' if success else 'failure'} "
                    f"({(r.get('outcome') or {}).get('reason') or r.get('error')}; {r['wall_s']} s)")
            entry["replay"] = {"episodes": len(episodes), "successes": replayed_ok,
                               "same_outcome": same, "same_outcome_rate": round(same / max(len(episodes), 1), 3),
                               "mismatches": mismatches, "wall_s": round(time.monotonic() - t_replay, 1)}
        summary[task] = entry
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    if args.out is None and not args.keep:  # a failed run keeps its folder: its logs say why
        shutil.rmtree(out, ignore_errors=True)
        summary["out"] = None
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
