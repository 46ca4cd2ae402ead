"""Arm teleop cycle cost and accuracy: our ArmIK + Ruckig vs pink on the same targets.

1. Target sequence, built once: the synthetic operator (120 Hz, fixed seed)
   goes through TrackerSet and ArmTeleop at 200 Hz, calibrated at t = 1 s
   and engaged (motion limits: the robot's arm limits x 0.5); every
   ``ArmIK.solve`` call is recorded (torso-frame wrist target after
   calibration and clutch, elbow hint) together with the 200 Hz cycle it
   belongs to. Only cycles with a new operator sample solve.
2. Ours: the recorded cycles are replayed through a fresh loop, per cycle
   ``ArmIK.solve`` for each side with a new target (warm start: that side's
   previous solution), then one 14-joint ``JerkLimitedFollower.step``.
3. pink, same cycles, same loop, same Ruckig follower: per side a pink
   ``Configuration`` on a copy of ArmIK's reduced 7-joint model (position
   limits set to ArmIK's shrunk limits, so both have the same feasible set),
   a ``FrameTask`` on the tip frame (position and orientation cost 1, target
   in the reduced model's world frame), a ``PostureTask`` (cost 1e-3, target:
   the warm start) as regulariser, pink's default limits (configuration +
   velocity). Per cycle ``solve_ik`` + ``integrate_inplace`` are iterated
   until ArmIK's tolerances or ``max_iterations``. ``dt = 1`` with task gain 1
   makes each QP step a full Gauss-Newton step (``dt`` then only scales the
   velocity limit, which does not bind: 3.14 rad per step). Tried and worse:
   ``dt = 5 ms`` (the velocity limit binds: more iterations, p99 +40 %),
   gain 0.5 (~4.7 iterations per solve), no velocity limit or posture cost
   0 / 1e-4 / 1e-2 or LM damping 1e-3 (no measurable difference).
   Column "pink" has no elbow task: it does less work than ours (its swivel
   drifts off the hint). Column "pink+elbow" adds a position-only ``FrameTask`` on the elbow frame towards
   the hint projected on the upper-arm sphere around the shoulder (the hint
   is an upper-arm point), cost ``--pink-elbow-cost`` (0.01; 0.03 gives
   worse wrist accuracy, 0.1 fights the wrist task and hits max_iterations).
   Column "ours-wrist" is ours without the elbow hint: the same task set as
   plain pink, so its accuracy compares like for like (the hint changes which
   configurations the arm passes through, and with them the residuals).
   Headline JSON keys: the same task set on both sides, i.e. "ours" (as the
   node runs it: wrist + elbow) against "pink+elbow"; the wrist-only pair
   ("ours-wrist" vs "pink") follows under ``wrist_only_*`` keys, and the goal
   line is printed for both pairs.
   The chains take turns every ``--block`` cycles (50), so slow machine noise
   hits them alike; ``--block 1`` alternates every cycle, which adds each
   chain's cache misses after the others' work (ours: ~+25 % p50, pink ~+5 %).
4. Per-cycle time (both arms' IK + Ruckig, time.perf_counter) is reported for
   cycles that solve; the first 200 replayed cycles are warm-up and excluded;
   gc stays enabled, ``gc.collect()`` runs before the timed pass. Accuracy:
   ``pose_error(ArmIK.forward(q), target)`` of every solve; swivel error: the
   angle about the shoulder-wrist axis between the elbow and the hint.
5. Node pair (``tracker`` + ``arm_ik`` composed, see :func:`measure_node_pair`):
   period jitter of ``/arms/command`` on the receive side and the node's own
   tracker-to-command latency; null while those nodes are not registered.

    .venv/bin/python bench/arm_ik.py [--seconds 30] [--seed 1] [--solver daqp]
                                     [--pink-elbow-cost 0.01] [--node-seconds 10]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pinocchio as pin

from rynn_teleop.core.arm_ik import ArmIK
from rynn_teleop.core.arm_teleop import DEFAULT_HOME, ArmTeleop
from rynn_teleop.core.layout import N_ARM, ROLES
from rynn_teleop.core.motion import JerkLimitedFollower
from rynn_teleop.core.robot_model import GROUPS, JointLimits, RobotModel
from rynn_teleop.core.trackers import TrackerSet
from rynn_teleop.core.transforms import pose_error
from rynn_teleop.sources.trackers import SyntheticOperator

SIDES = ("left", "right")
RATE_HZ = 200.0
DT = 1.0 / RATE_HZ
CALIBRATE_AT = 1.0  # [s] operator time of calibration + engage
WARMUP_CYCLES = 200
PINK_SOLVERS = ("daqp", "quadprog", "proxqp")


class Solve(NamedTuple):
    side: str
    target: np.ndarray  # (4, 4) torso frame
    hint: np.ndarray | None  # (3,) torso frame
    q_init: np.ndarray  # (7,) warm start the controller used (for the replay check)


class Solved(NamedTuple):
    cycle: int
    side: str
    q: np.ndarray
    iterations: int


# ---------------------------------------------------------------------- targets
def motion_limits(robot: RobotModel) -> JointLimits:
    lim = robot.limits[np.r_[GROUPS.left_arm, GROUPS.right_arm]]
    return JointLimits(lim.lower, lim.upper, 0.5 * lim.velocity, 0.5 * lim.acceleration, 0.5 * lim.jerk)


def record_targets(robot: RobotModel, seconds: float, seed: int) -> list[list[Solve]]:
    """Per 200 Hz cycle from the first solve on, the ArmIK.solve calls the controller made."""
    ctl = ArmTeleop(robot, np.array(DEFAULT_HOME), motion_limits(robot))
    serials = {r: f"LHR-{i:08d}" for i, r in enumerate(ROLES)}
    src = SyntheticOperator(serials, rate_hz=120, seed=seed)
    src.start(0.0)
    trackers = TrackerSet(serials, 0.1)
    cycles: list[list[Solve]] = []
    for side in SIDES:
        solve = ctl.ik[side].solve

        def recording(target, q_init, hint=None, _solve=solve, _side=side):
            h = None if hint is None else np.array(hint)
            cycles[-1].append(Solve(_side, np.array(target), h, np.array(q_init)))
            return _solve(target, q_init, hint)

        ctl.ik[side].solve = recording
    for k in range(round((CALIBRATE_AT + seconds) / DT)):
        now = k * DT
        for sample in src.read(now):
            trackers.update(sample)
        for side in SIDES:
            rel = trackers.relative(side, now)
            if rel is not None:
                ctl.set_operator(side, rel.wrist, None if rel.elbow is None else rel.elbow[:3, 3], rel.stamp)
        if k == round(CALIBRATE_AT / DT):
            ctl.calibrate(now)
            ok, why = ctl.engage()
            if not ok:
                raise RuntimeError(f"engage refused: {why}")
        cycles.append([])
        ctl.step(now)
    first = next(i for i, c in enumerate(cycles) if c)
    return cycles[first:]


# ---------------------------------------------------------------------- solvers
SolveFn = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], tuple[np.ndarray, int]]


def ours_solver(ik: ArmIK, *, use_hint: bool = True) -> SolveFn:
    def solve(target, q_init, hint):
        r = ik.solve(target, q_init, hint if use_hint else None)
        return r.q, r.iterations

    return solve


def pick_pink_solver(wanted: str) -> str:
    import qpsolvers

    available = qpsolvers.available_solvers
    if wanted in available:
        return wanted
    for name in PINK_SOLVERS:
        if name in available:
            print(f"note: QP solver {wanted!r} not installed; pink uses {name!r}")
            return name
    raise SystemExit(f"no QP solver for pink among {PINK_SOLVERS}; installed: {available}")


def pink_solver(ik: ArmIK, home: np.ndarray, qp: str, *, elbow_cost: float = 0.0, posture_cost: float = 1e-3,
                dt: float = 1.0, gain: float = 1.0) -> SolveFn:
    """pink on ArmIK's reduced model, iterated to ArmIK's tolerances (see the module docstring)."""
    from pink import Configuration, solve_ik
    from pink.tasks import FrameTask, PostureTask

    s = ik.settings
    model = ik.model.copy()
    model.lowerPositionLimit = ik.lower.copy()
    model.upperPositionLimit = ik.upper.copy()
    conf = Configuration(model, model.createData(), np.clip(home, ik.lower, ik.upper))
    wrist = FrameTask(ik.tip_frame, position_cost=1.0, orientation_cost=1.0, gain=gain)
    posture = PostureTask(cost=posture_cost)
    tasks = [wrist, posture]
    elbow = None
    shoulder = conf.data.oMf[model.getFrameId(f"{ik.side}_arm_link2")].translation.copy()  # fixed by the arm's joints
    upper_arm = float(np.linalg.norm(conf.data.oMf[model.getFrameId(ik.elbow_frame)].translation - shoulder))
    if elbow_cost > 0:
        elbow = FrameTask(ik.elbow_frame, position_cost=elbow_cost, orientation_cost=0.0, gain=gain)
        tasks.append(elbow)
    tip = model.getFrameId(ik.tip_frame)
    world_base = ik._world_base

    def solve(target, q_init, hint):
        goal = world_base * pin.SE3(target)
        wrist.set_target(goal)
        conf.update(np.clip(q_init, ik.lower, ik.upper))
        posture.set_target(conf.q)
        active = tasks
        if elbow is not None:
            if hint is None:
                active = tasks[:2]
            else:  # the hint is an upper-arm point: aim the elbow frame along it, on its sphere
                d = world_base.act(hint) - shoulder
                elbow.set_target(pin.SE3(np.eye(3), shoulder + upper_arm * d / np.linalg.norm(d)))
        it = 0
        while True:
            cur = conf.data.oMf[tip]
            dp = goal.translation - cur.translation
            rot = pin.log3(cur.rotation.T @ goal.rotation)
            converged = dp @ dp <= s.position_tolerance**2 and rot @ rot <= s.orientation_tolerance**2
            if converged or it >= s.max_iterations:
                break
            v = solve_ik(conf, active, dt, solver=qp, safety_break=False)
            conf.integrate_inplace(v, dt)
            it += 1
        return conf.q.copy(), it

    return solve


# ---------------------------------------------------------------------- replay
class _Chain:
    """One IK + Ruckig loop with its own warm starts and follower."""

    def __init__(self, solvers: dict[str, SolveFn], limits: JointLimits, n_cycles: int) -> None:
        home = np.array(DEFAULT_HOME)
        self.solvers = solvers
        self.follower = JerkLimitedFollower(limits, DT, target_margin=0.02)
        self.follower.reset(home)
        self.q_goal = {"left": home[:N_ARM].copy(), "right": home[N_ARM:].copy()}
        self.seen = {"left": False, "right": False}
        self.times = np.empty(n_cycles)
        self.solved: list[Solved] = []

    def cycle(self, k: int, solves: list[Solve]) -> None:
        t0 = time.perf_counter()
        for solve in solves:
            q, iterations = self.solvers[solve.side](solve.target, self.q_goal[solve.side], solve.hint)
            self.q_goal[solve.side] = q
            self.seen[solve.side] = True
            self.solved.append(Solved(k, solve.side, q, iterations))
        goal = np.concatenate((self.q_goal["left"], self.q_goal["right"]))
        self.follower.step(goal, np.repeat((self.seen["left"], self.seen["right"]), N_ARM))
        self.times[k] = time.perf_counter() - t0


def replay(cycles: list[list[Solve]], chains: dict[str, dict[str, SolveFn]], limits: JointLimits,
           block: int = 50) -> dict[str, _Chain]:
    """Replay ``cycles`` through every chain, taking turns every ``block`` cycles (order
    rotating), so that slow machine noise (other processes, frequency changes) hits all
    chains alike while each runs warm within its turn (``block=1``: strict alternation,
    where each chain's code is evicted from the caches by the others every cycle).

    Each chain's per-cycle wall time covers the IK of every side with a new
    target plus one Ruckig step.
    """
    runs = {name: _Chain(solvers, limits, len(cycles)) for name, solvers in chains.items()}
    order = list(runs.values())
    gc.collect()
    for turn, start in enumerate(range(0, len(cycles), block)):
        for i in range(len(order)):
            chain = order[(turn + i) % len(order)]
            for k in range(start, min(start + block, len(cycles))):
                chain.cycle(k, cycles[k])
    return runs


def swivel_angle(robot_q: np.ndarray, ik: ArmIK, hint: np.ndarray, frames: dict[str, int]) -> float:
    """Angle [rad] about the shoulder-wrist axis between the elbow and the hint (both in the base frame)."""
    pin.framesForwardKinematics(ik.model, ik.data, robot_q)
    inv = ik._world_base.inverse()
    s, e, w = (inv.act(ik.data.oMf[frames[n]].translation) for n in ("shoulder", "elbow", "wrist"))
    axis = (w - s) / np.linalg.norm(w - s)
    u = (e - s) - axis * (axis @ (e - s))
    v = (hint - s) - axis * (axis @ (hint - s))
    return float(np.arctan2(np.linalg.norm(np.cross(u, v)), u @ v))


def evaluate(
    name: str, cycles: list[list[Solve]], times: np.ndarray, solved: list[Solved], iks: dict[str, ArmIK]
) -> dict:
    frames = {
        s: {"shoulder": ik.model.getFrameId(f"{s}_arm_link2"), "elbow": ik.model.getFrameId(ik.elbow_frame),
            "wrist": ik.model.getFrameId(f"{s}_arm_link6")}
        for s, ik in iks.items()
    }
    targets = [s for c in cycles for s in c]
    pos, rot, swivel, its = [], [], [], []
    for task, res in zip(targets, solved):
        if res.cycle < WARMUP_CYCLES:
            continue
        ik = iks[task.side]
        err = pose_error(ik.forward(res.q), task.target)
        pos.append(err.position)
        rot.append(err.orientation)
        its.append(res.iterations)
        if task.hint is not None:
            swivel.append(swivel_angle(res.q, ik, task.hint, frames[task.side]))
    solving = np.array([bool(c) for c in cycles])
    solving[:WARMUP_CYCLES] = False
    idle = np.array([not c for c in cycles])
    idle[:WARMUP_CYCLES] = False
    t = times[solving]
    pos, rot, swivel = np.array(pos), np.array(rot), np.array(swivel)
    tol = next(iter(iks.values())).settings
    return {
        "name": name,
        "cycles": int(solving.sum()),
        "cycle_p50_ms": 1e3 * float(np.percentile(t, 50)),
        "cycle_p99_ms": 1e3 * float(np.percentile(t, 99)),
        "cycle_max_ms": 1e3 * float(t.max()),
        "idle_cycle_p50_ms": 1e3 * float(np.percentile(times[idle], 50)) if idle.any() else float("nan"),
        "iterations_mean": float(np.mean(its)),
        "iterations_max": int(np.max(its)),
        "pos_err_p50_mm": 1e3 * float(np.percentile(pos, 50)),
        "pos_err_p99_mm": 1e3 * float(np.percentile(pos, 99)),
        "rot_err_p99_deg": float(np.degrees(np.percentile(rot, 99))),
        "within_tol": float(np.mean((pos <= tol.position_tolerance + 1e-9)
                                    & (rot <= tol.orientation_tolerance + 1e-9))),
        "swivel_err_p50_deg": float(np.degrees(np.percentile(swivel, 50))) if swivel.size else float("nan"),
        "swivel_err_p99_deg": float(np.degrees(np.percentile(swivel, 99))) if swivel.size else float("nan"),
    }


def check_replay(cycles: list[list[Solve]], solved: list[Solved]) -> float:
    """Largest difference [rad] between our replay's warm starts and the controller's (same chain: ~0)."""
    last: dict[str, np.ndarray] = {}
    worst = 0.0
    for task, res in zip((s for c in cycles for s in c), solved):
        if task.side in last:
            worst = max(worst, float(np.abs(task.q_init - last[task.side]).max()))
        last[task.side] = res.q
    return worst


# ---------------------------------------------------------------------- node pair
def measure_node_pair(seconds: float) -> dict:
    """Period jitter of ``/arms/command`` and tracker-to-command latency of the composed
    ``tracker`` + ``arm_ik`` nodes, run for ``seconds``; None values while they are not registered.

    Jitter: |inter-arrival time - 5 ms| on the receive side (a probe node in
    the same composition). Latency: the ``arm_ik`` node's own
    ``meters["command"]`` (operator sample capture -> command); the publish
    path (receive time - ``header.stamp``) is reported beside it.
    """
    none = {"period_jitter_p99_ms": None, "latency_p99_ms": None, "publish_latency_p99_ms": None}
    from rynn_teleop.nodes import REGISTRY  # does not import rclpy

    if not ("arm_ik" in REGISTRY and "tracker" in REGISTRY):
        print("note: nodes 'tracker' and 'arm_ik' are not registered yet; node-pair timing skipped (null)")
        return none
    # DDS stays on loopback, on a domain of its own (as scripts/ros_env.sh), before rclpy is imported
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ.setdefault("ROS_LOG_DIR", tempfile.mkdtemp(prefix="rynn_teleop_bench_roslog_"))
    domain_id = random.randint(10, 99)
    from rclpy.node import Node
    from rclpy.time import Time
    from sensor_msgs.msg import JointState

    from rynn_teleop.runner import Composition

    arrivals: list[float] = []  # [s] perf_counter at receive
    publish_lat: list[float] = []  # [s] receive ROS time - header.stamp
    settle = 1.0  # [s] startup (calibration, engagement) left out

    comp = Composition(
        ["tracker", "arm_ik"],
        overrides={"tracker": {"backend": "synthetic"},
                   "arm_ik": {"auto_calibrate": True, "auto_engage": True, "start_from": "home"}},
        domain_id=domain_id,
    )
    probe = Node("arm_ik_bench_probe", context=comp.context)

    def on_command(msg: JointState) -> None:
        arrivals.append(time.perf_counter())
        publish_lat.append((probe.get_clock().now() - Time.from_msg(msg.header.stamp)).nanoseconds * 1e-9)

    probe.create_subscription(JointState, "/arms/command", on_command, 50)
    comp.add_node(probe)
    try:
        comp.spin(seconds)
        arm_ik = comp.node("arm_ik")
        meter = arm_ik.meters.get("command")  # the node ticks it with tracker-to-command latency [s]
        node_latency = meter.latency_percentiles(99)[0] if meter is not None else float("nan")
    finally:
        comp.remove_node(probe)
        comp.shutdown()
    if comp.errors:
        raise RuntimeError(f"node callbacks raised: {comp.errors!r}")
    t = np.array(arrivals)
    keep = t >= t[0] + settle if t.size else t.astype(bool)
    if keep.sum() < 3:
        print(f"note: only {t.size} commands arrived on /arms/command in {seconds} s")
        return none
    jitter = np.abs(np.diff(t[keep]) - DT)
    return {
        "period_jitter_p99_ms": 1e3 * float(np.percentile(jitter, 99)),
        "latency_p99_ms": 1e3 * node_latency if np.isfinite(node_latency) else None,
        "publish_latency_p99_ms": 1e3 * float(np.percentile(np.array(publish_lat)[keep], 99)),
        "rate_hz": float((keep.sum() - 1) / (t[keep][-1] - t[keep][0])),
    }


# ---------------------------------------------------------------------- main
def _r(v: float | None) -> float | None:
    return None if v is None or not np.isfinite(v) else round(float(v), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="operator time after calibration [s]")
    parser.add_argument("--seed", type=int, default=1, help="synthetic operator seed")
    parser.add_argument("--cycles", type=int, default=None, help="replay at most this many 200 Hz cycles")
    parser.add_argument("--solver", default="daqp", help="pink's QP solver (falls back to quadprog/proxqp)")
    parser.add_argument("--pink-elbow-cost", type=float, default=0.01,
                        help="cost of the elbow task of the extra 'pink+elbow' column (0: no such column)")
    parser.add_argument("--block", type=int, default=50,
                        help="chains take turns every this many cycles (1: every cycle)")
    parser.add_argument("--node-seconds", type=float, default=10.0, help="node-pair run time [s] (0: skip)")
    args = parser.parse_args()

    robot = RobotModel.default()
    limits = motion_limits(robot)
    home = {"left": np.array(DEFAULT_HOME[:N_ARM]), "right": np.array(DEFAULT_HOME[N_ARM:])}
    t0 = time.perf_counter()
    cycles = record_targets(robot, args.seconds, args.seed)[: args.cycles]
    n_solves = sum(len(c) for c in cycles)
    print(f"targets: {len(cycles)} cycles at {RATE_HZ:.0f} Hz, {sum(bool(c) for c in cycles)} with solves, "
          f"{n_solves} solves (recorded in {time.perf_counter() - t0:.1f} s)")
    if len(cycles) <= WARMUP_CYCLES + 100:
        raise SystemExit("too few cycles: raise --seconds / --cycles")

    iks = {s: ArmIK(robot, s) for s in SIDES}  # pink's models and the error evaluation
    qp = pick_pink_solver(args.solver)
    chains = {
        "ours": {s: ours_solver(ArmIK(robot, s)) for s in SIDES},
        "pink": {s: pink_solver(iks[s], home[s], qp) for s in SIDES},
        # the same task set as plain pink (wrist only), to compare accuracy like for like
        "ours-wrist": {s: ours_solver(ArmIK(robot, s), use_hint=False) for s in SIDES},
    }
    if args.pink_elbow_cost > 0:
        chains["pink+elbow"] = {s: pink_solver(iks[s], home[s], qp, elbow_cost=args.pink_elbow_cost) for s in SIDES}
    t0 = time.perf_counter()
    runs = replay(cycles, chains, limits, args.block)
    print(f"replayed {len(chains)} chains, turns of {args.block} cycles, in {time.perf_counter() - t0:.1f} s")
    res = {name: evaluate(name, cycles, run.times, run.solved, iks) for name, run in runs.items()}
    drift = check_replay(cycles, runs["ours"].solved)
    # Headline: the same task set on both sides. With the elbow column (default) that is the
    # controller as the node runs it (wrist + elbow swivel) against pink given the elbow task;
    # the wrist-only pair (ours-wrist vs plain pink) is reported beside it.
    if "pink+elbow" in res:
        ours, pink = res["ours"], res["pink+elbow"]
    else:
        ours, pink = res["ours-wrist"], res["pink"]
    speedup = pink["cycle_p99_ms"] / ours["cycle_p99_ms"]
    wrist_speedup = res["pink"]["cycle_p99_ms"] / res["ours-wrist"]["cycle_p99_ms"]

    rows = [
        ("cycle p50 [ms] (2x IK + Ruckig)", "cycle_p50_ms", "{:.3f}"),
        ("cycle p99 [ms]", "cycle_p99_ms", "{:.3f}"),
        ("cycle max [ms]", "cycle_max_ms", "{:.3f}"),
        ("cycle without solve p50 [ms] (Ruckig)", "idle_cycle_p50_ms", "{:.3f}"),
        ("iterations per solve, mean", "iterations_mean", "{:.2f}"),
        ("iterations per solve, max", "iterations_max", "{:d}"),
        ("position error p50 [mm]", "pos_err_p50_mm", "{:.3f}"),
        ("position error p99 [mm]", "pos_err_p99_mm", "{:.3f}"),
        ("orientation error p99 [deg]", "rot_err_p99_deg", "{:.3f}"),
        ("solves within tolerance [-]", "within_tol", "{:.3f}"),
        ("elbow swivel vs hint p50 [deg]", "swivel_err_p50_deg", "{:.1f}"),
        ("elbow swivel vs hint p99 [deg]", "swivel_err_p99_deg", "{:.1f}"),
    ]
    print(f"\n{ours['cycles']} cycles with solves timed (first {WARMUP_CYCLES} cycles warm-up); "
          f"pink: QP {qp}, dt 1, gain 1, posture cost 1e-3, no elbow task"
          + (f"; pink+elbow: elbow position cost {args.pink_elbow_cost:g}" if "pink+elbow" in res else "")
          + f"; replay warm starts match the controller's to {drift:.1e} rad")
    print(f"{'':40s}" + "".join(f" {name:>10s}" for name in res))
    for label, key, fmt in rows:
        print(f"{label:40s}" + "".join(f" {fmt.format(r[key]):>10s}" for r in res.values()))
    print(f"{'speedup vs ours (p99 / ours p99)':40s}" + "".join(
        f" {r['cycle_p99_ms'] / ours['cycle_p99_ms']:>10.2f}" for r in res.values()))

    node = measure_node_pair(args.node_seconds) if args.node_seconds > 0 else {
        "period_jitter_p99_ms": None, "latency_p99_ms": None, "publish_latency_p99_ms": None}

    def fmt_ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    print(f"{'node pair: /arms/command jitter p99 [ms]':40s} {fmt_ms(node['period_jitter_p99_ms']):>10s}")
    print(f"{'node pair: tracker->command p99 [ms]':40s} {fmt_ms(node['latency_p99_ms']):>10s}")
    print(f"{'node pair: publish->receive p99 [ms]':40s} {fmt_ms(node['publish_latency_p99_ms']):>10s}")
    if node.get("rate_hz") is not None:
        print(f"{'node pair: /arms/command rate [Hz]':40s} {node['rate_hz']:>10.1f}")

    def goal_met(a: dict, b: dict, ratio: float) -> bool:
        as_accurate = (a["pos_err_p99_mm"] <= b["pos_err_p99_mm"] + 1e-3
                       and a["rot_err_p99_deg"] <= b["rot_err_p99_deg"] + 1e-3)
        return a["cycle_p99_ms"] <= 0.5 and ratio >= 2.0 and as_accurate

    for label, a, b, ratio in (
        (f"{ours['name']} vs {pink['name']} (headline)", ours, pink, speedup),
        ("ours-wrist vs pink (wrist task only)", res["ours-wrist"], res["pink"], wrist_speedup),
    ):
        print(f"goal (p99 <= 0.5 ms, >= 2x faster, equal or better accuracy), {label}: "
              f"{'met' if goal_met(a, b, ratio) else 'NOT met'}: p99 {a['cycle_p99_ms']:.3f} vs "
              f"{b['cycle_p99_ms']:.3f} ms ({ratio:.2f}x), position error p99 {a['pos_err_p99_mm']:.3f} vs "
              f"{b['pos_err_p99_mm']:.3f} mm, orientation {a['rot_err_p99_deg']:.3f} vs {b['rot_err_p99_deg']:.3f} deg")

    print(json.dumps({
        "cycle_p99_ms": _r(ours["cycle_p99_ms"]),
        "pink_cycle_p99_ms": _r(pink["cycle_p99_ms"]),
        "speedup_vs_pink": _r(speedup),
        "pos_err_p99_mm": _r(ours["pos_err_p99_mm"]),
        "pink_pos_err_p99_mm": _r(pink["pos_err_p99_mm"]),
        "period_jitter_p99_ms": _r(node["period_jitter_p99_ms"]),
        "latency_p99_ms": _r(node["latency_p99_ms"]),
        "cycle_p50_ms": _r(ours["cycle_p50_ms"]),
        "pink_cycle_p50_ms": _r(pink["cycle_p50_ms"]),
        "rot_err_p99_deg": _r(ours["rot_err_p99_deg"]),
        "pink_rot_err_p99_deg": _r(pink["rot_err_p99_deg"]),
        "iterations_mean": _r(ours["iterations_mean"]),
        "pink_iterations_mean": _r(pink["iterations_mean"]),
        "publish_latency_p99_ms": _r(node["publish_latency_p99_ms"]),
        "pink_solver": qp,
        "headline": f"{ours['name']} vs {pink['name']}",
        "pink_elbow_cost": args.pink_elbow_cost,
        "wrist_only_cycle_p99_ms": _r(res["ours-wrist"]["cycle_p99_ms"]),
        "wrist_only_pink_cycle_p99_ms": _r(res["pink"]["cycle_p99_ms"]),
        "wrist_only_speedup_vs_pink": _r(wrist_speedup),
        "wrist_only_pos_err_p99_mm": _r(res["ours-wrist"]["pos_err_p99_mm"]),
        "wrist_only_pink_pos_err_p99_mm": _r(res["pink"]["pos_err_p99_mm"]),
        "cycles": ours["cycles"],
        "seconds": args.seconds,
        "seed": args.seed,
    }))


if __name__ == "__main__":
    main()
