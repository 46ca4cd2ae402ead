"""policy node: a learned policy drives the robot through the same safety layer as teleoperation.

The policy is built from the ``backend`` parameter (``rynn_teleop.policies.POLICY_BACKENDS``; each with its
settings under ``<backend>.``; ``path`` gives the backend's path setting: ``lerobot.path``, ``replay.dataset``).
A policy for another robot (its action dimension or joint order, a camera the robot has not) or one that cannot be
loaded refuses the start, with the reason. Its :class:`~..policies.base.PolicySpec` says what it takes: the frame
rate (``fps``) of the dataset it was trained on, the joint order, its cameras and their image sizes.

The rules are ``policies.controller.PolicyController``'s (states, start, stale hold, stop, e-stop); this node
converts messages and calls it:

* a loop at ``arm_rate_hz`` (200 Hz, as teleoperation's arm_ik) drains ``/joint_states`` (the start's measured
  arms, the observation's state) and publishes the arms' jerk-limited command on ``/arms/command`` (position and
  velocity, stamped with the cycle's time) and, at ``hand_rate_hz``, the hands' on ``/hands/command``: every
  command goes through the drivers' safety layer (limits, ramp, watchdog, e-stop), as the operator's;
* a loop at the policy's ``fps`` takes the newest frame of each of its cameras (``recording.frames.FEED_TOPICS``)
  and, while running on a fresh observation, hands them to the inference thread: the observation is built as the
  LeRobot export lays out a row (``policies.observation.ObservationBuilder``: the frame resized to the policy's
  size, the joint states sampled at the frame's stamp) and ``act()`` runs there, so the 200 Hz loop never waits for
  inference; when the previous ``act()`` still runs at the next frame, that frame is skipped (``overruns``);
* ``~/start`` / ``~/stop`` (``rynn-teleop call policy start|stop``, the console): a stop brakes the arms to a stop;
  ``/estop`` and a driver reporting its e-stop latched (its status in ``/diagnostics``) stop all commands at once;
* with ``record_episodes`` and a recorder running, a start starts an episode (``/recorder/start_episode``) and the
  run's end (stop, ``max_episode_s``, e-stop, a policy error) ends it (``/recorder/stop_episode``): the twin's
  judgement is its outcome.

Status in /diagnostics: ``core.status.PolicyStatus`` (state, reason, policy, its fps, run, steps, overruns, last
error), the ``act`` meter (actions a second; latency: the time of one ``act()``, against a budget of one frame) and
the ``command`` meter (arm commands a second).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool
from std_srvs.srv import Trigger

from ..core.motion import arm_motion_limits
from ..core.node_io import SENSOR_DATA, Each, NodeIO, QoS, Service, Topic, when
from ..core.params import FLOAT_LIST, Param
from ..core.plugins import BackendSchema
from ..core.session import DRIVERS, POLICY_METER
from ..core.status import DriverStatus, PolicyStatus, StatusError
from ..errors import ParameterError
from ..policies import POLICY_BACKENDS, PolicyContext, PolicyRunner
from ..policies.controller import ARM_NAMES, HAND_NAMES, ControllerSettings, PolicyController, path_setting_of
from ..policies.errors import PolicyError
from ..policies.observation import ObservationBuilder
from ..recording.cdr import joint_state
from ..recording.frames import FEED_TOPICS
from ._robot import DESCRIPTION_OVERLAY, robot_from_overlay
from .arm_ik import DEFAULT_ACCELERATION, DEFAULT_JERK, DEFAULT_VELOCITY
from .base import TeleopNode, run_single
from .conversions import image_array

COMMAND_QOS = QoS(100)  # as arm_ik's and hand_retarget's: half a second for a subscriber that falls behind
JOINT_STATES_QOS = QoS(100, reliable=False)  # drained at every arm cycle
INBOX = 2000  # joint-state messages kept for the observation between two act() calls (5 s of both drivers)
PENDING_FRAMES = 3  # newest frames per camera kept for the next observation (a second camera's may be older)
CLOSE_TIMEOUT_S = 2.0  # [s] the inference thread is waited for this long at shutdown (then the runner is closed)


class _Inference:
    """The policy's calls, one at a time, on a thread of their own (never the executor's or a loop's)."""

    def __init__(self, name: str, on_error: Callable[[BaseException], None]) -> None:
        self._on_error = on_error
        self._cv = threading.Condition()
        self._job: Callable[[], None] | None = None
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """A call runs or waits to run."""
        with self._cv:
            return self._busy or self._job is not None

    def submit(self, job: Callable[[], None]) -> bool:
        """Run ``job()`` on the thread; False (not run) while another one runs or waits."""
        with self._cv:
            if self._closed or self._busy or self._job is not None:
                return False
            self._job = job
            self._cv.notify()
            return True

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._job is not None or self._closed)
                if self._closed:
                    return
                job, self._job, self._busy = self._job, None, True
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - reported; the next call runs
                if not self._closed:  # after close: the node is being destroyed under it
                    self._on_error(exc)
            finally:
                with self._cv:
                    self._busy = False

    def close(self) -> None:
        """No more calls; wait (at most :data:`CLOSE_TIMEOUT_S`) for the running one to end."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_TIMEOUT_S)


class PolicyNode(TeleopNode):
    PRIORITY = "control"  # the 200 Hz arm loop -> /arms/command (inference runs in its own thread or process)
    SCHEMA = BackendSchema(
        "policy",
        [
            DESCRIPTION_OVERLAY,
            Param("path", str, "", "the policy to run: the backend's path setting (lerobot: lerobot.path, a "
                  "lerobot-train folder; replay: replay.dataset, an exported dataset); empty: the backend's setting"),
            Param("arm_rate_hz", float, 200.0, "arm command rate (the jerk-limited follower's cycle, as arm_ik's)",
                  "Hz", min=50.0, max=1000.0),
            Param("hand_rate_hz", float, 90.0, "each hand's command is sent this often (the newest action's, "
                  "repeated; one message per hand, as hand_retarget sends them); at most arm_rate_hz", "Hz",
                  min=10.0, max=1000.0),
            Param("max_velocity", FLOAT_LIST, DEFAULT_VELOCITY,
                  "follower velocity limit per arm joint 1-7 (both arms); at most the robot's", "rad/s",
                  min=0.01, max=10.0, length=7),
            Param("max_acceleration", FLOAT_LIST, DEFAULT_ACCELERATION,
                  "follower acceleration limit per arm joint 1-7; at most the robot's", "rad/s^2",
                  min=0.01, max=100.0, length=7),
            Param("max_jerk", FLOAT_LIST, DEFAULT_JERK, "follower jerk limit per arm joint 1-7; at most the robot's",
                  "rad/s^3", min=0.1, max=10000.0, length=7),
            Param("target_margin", float, 0.02, "arm targets stay this far inside the position limits", "rad",
                  min=0.0, max=0.3),
            Param("stale_timeout_s", float, 0.5, "a camera frame or joint state older than this is stale: the policy "
                  "holds (the arms brake and stay, the hands keep their command) until fresh again; a start needs "
                  "fresh ones", "s", min=0.02, max=5.0),
            Param("start_tolerance", float, 0.01, "a measured arm position at most this far outside its limit is "
                  "clipped at a start; further out the start is refused", "rad", min=0.0, max=0.1),
            Param("max_episode_s", float, 0.0, "a run stops by itself after this long (0: never)", "s",
                  min=0.0, max=86400.0),
            Param("record_episodes", bool, True, "while a recorder runs, a start starts an episode "
                  "(/recorder/start_episode) and the run's end stops it (/recorder/stop_episode)"),
            Param("joint_states_topic", str, "/joint_states", "measured joint states (the observation's state)"),
            Param("arm_command_topic", str, "/arms/command", "arm command output (the arm driver's command topic)"),
            Param("hand_command_topic", str, "/hands/command", "hand command output (the hand driver's)"),
        ],
        backends=POLICY_BACKENDS, default="lerobot", description="the policy backend",
    )
    IO = NodeIO(
        publishers=(
            Topic("{arm_command_topic}", "sensor_msgs/msg/JointState", COMMAND_QOS,
                  "the 14 arm joints, position + velocity, one per arm cycle (arm_rate_hz) from a start until the "
                  "arms rest after its end (never while e-stopped), stamped with the cycle's time"),
            Topic("{hand_command_topic}", "sensor_msgs/msg/JointState", COMMAND_QOS,
                  "one hand's 20 joints per message (canonical order, as hand_retarget), position: the newest "
                  "action's, each hand at hand_rate_hz, from a run's first action until the arms rest after its end "
                  "(never while e-stopped)"),
        ),
        subscriptions=(
            Topic("{joint_states_topic}", "sensor_msgs/msg/JointState", JOINT_STATES_QOS,
                  "the measured joints (the observation's state, sampled at each frame's stamp; the arms' start), "
                  "drained at each arm cycle"),
            Topic("{camera_topic}", "sensor_msgs/msg/Image", SENSOR_DATA,
                  "each camera of the policy (recording.frames.FEED_TOPICS of its spec's camera keys), rgb8; the "
                  "newest frames are taken at each policy step", each=Each("camera_topic", param="camera_topics")),
            Topic("/estop", "std_msgs/msg/Bool", QoS(10), "true: command nothing more at once (e-stopped)"),
            Topic("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray", QoS(50),
                  "the drivers' status (core.status.DriverStatus): one reporting its e-stop latched e-stops the "
                  "policy; all reporting it released make it idle again"),
        ),
        services=(
            Service("~/start", "std_srvs/srv/Trigger", "start acting (refused while e-stopped, after a fatal policy "
                    "failure, or without a fresh observation); the policy's history is reset"),
            Service("~/stop", "std_srvs/srv/Trigger", "stop acting: the arms brake to a stop, the hands hold"),
        ),
        clients=(
            Service("/recorder/start_episode", "std_srvs/srv/Trigger", "an episode per run (record_episodes)",
                    when=(when("record_episodes", True),)),
            Service("/recorder/stop_episode", "std_srvs/srv/Trigger", "the run's episode ends with it",
                    when=(when("record_episodes", True),)),
        ),
        facts={"camera_topics": "the image topics of the policy's cameras, in its spec's order"},
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        p = self.params
        log = self.get_logger()
        if p["hand_rate_hz"] > p["arm_rate_hz"]:
            raise ParameterError("hand_rate_hz", f"hand_rate_hz = {p['hand_rate_hz']:g} Hz is above arm_rate_hz = "
                                 f"{p['arm_rate_hz']:g} Hz; allowed range [10, arm_rate_hz]")
        self.robot = robot_from_overlay(p["description_overlay"])
        arm_motion = arm_motion_limits(self.robot.limits, p)
        self.runner: PolicyRunner = self.SCHEMA.create(self._backend_values(p), PolicyContext(self.robot, 0.0))
        try:
            self.spec = self.runner.spec
            self.spec.check(self.robot.joint_names)
            self.ctl = PolicyController(self.robot.limits, arm_motion, tuple(self.spec.images), ControllerSettings(
                arm_rate_hz=p["arm_rate_hz"], stale_timeout=p["stale_timeout_s"], max_episode=p["max_episode_s"],
                start_tolerance=p["start_tolerance"], target_margin=p["target_margin"]))
            self.builder = ObservationBuilder(self.spec)
        except BaseException:
            self.runner.close()
            raise
        self.close_on_destroy(self.runner)  # closed last: after the inference thread below
        self.cameras = tuple(self.spec.images)
        self.io_facts["camera_topics"] = [FEED_TOPICS[c] for c in self.cameras]
        self._inference = self.close_on_destroy(_Inference(f"{self.get_name()}:act", self._inference_error))
        self._states: deque[tuple[tuple[str, ...], np.ndarray, int]] = deque(maxlen=INBOX)  # for the builder
        self._pending: dict[str, deque] = {c: deque(maxlen=PENDING_FRAMES) for c in self.cameras}
        self._names_cache: dict[bytes, tuple[str, ...]] = {}
        self._reset_run = 0  # the run whose start reset the policy (the inference thread's)
        self.malformed_joint_states = 0
        self.no_observation = 0  # act() not called: the frame's joint states or another camera's frame missing
        self._hand_period = 1.0 / p["hand_rate_hz"]  # [s]
        self._arm_period = 1.0 / p["arm_rate_hz"]  # [s]
        self._hand_due = -float("inf")  # [s] when the hands' next command is due
        self._episode = ""  # the run's episode: '', 'starting', 'recording', 'stopping'
        self._episode_stop_wanted = False

        self._js_sub = self.io_polled_subscription("{joint_states_topic}", raw=True)
        self._camera_subs = {c: self.io_polled_subscription("{camera_topic}", camera_topic=FEED_TOPICS[c])
                             for c in self.cameras}
        self.io_subscription("/estop", self._on_estop)
        self.io_subscription("/diagnostics", self._on_diagnostics)
        self._arm_pub = self.io_publisher("{arm_command_topic}")
        self._hand_pub = self.io_publisher("{hand_command_topic}")
        self.io_service("~/start", self._srv_start)
        self.io_service("~/stop", self._srv_stop)
        self._recorder: dict[str, Any] = {}
        if p["record_episodes"]:
            for what in ("start_episode", "stop_episode"):
                d = self._declared("clients", f"/recorder/{what}", {})
                self._recorder[what] = self.create_client(d.cls, d.name)
        self._arm_msg = JointState(name=list(ARM_NAMES))
        self._hand_msgs = tuple((slice(20 * i, 20 * (i + 1)), JointState(name=list(HAND_NAMES[20 * i:20 * (i + 1)])))
                                for i in range(2))  # left, right
        # no nominal rates: an idle policy acts and commands nothing (its status says the frame rate to compare with)
        self.meter(POLICY_METER, latency_budget_ms=1e3 / self.spec.fps)  # an act() longer than a frame overruns
        self.meter("command")
        log.info(f"policy {self.spec.source} ({p['backend']} backend): {self.spec.fps:g} Hz, cameras "
                 + ", ".join(f"{c} {h}x{w} px ({FEED_TOPICS[c]})" for c, (h, w) in self.spec.images.items())
                 + "; idle: call ~/start (rynn-teleop call policy start)")
        self.create_loop(p["arm_rate_hz"], self._arm_tick, "arms")
        self.create_loop(self.spec.fps, self._policy_tick, "policy")

    # ------------------------------------------------------------------ setup
    def _backend_values(self, p: dict[str, Any]) -> dict[str, Any]:
        """The parameters with ``path`` given to the chosen backend's path setting."""
        values = dict(p)
        backend, path = p["backend"], p["path"]
        key = path_setting_of(backend)
        if key is None:
            if path:
                self.get_logger().warning(f"backend {backend!r} loads no policy from a path: path {path!r} is not "
                                          "used")
        elif path:
            values[f"{backend}.{key}"] = path
        elif not values[f"{backend}.{key}"]:
            raise ParameterError("path", f"no policy given: set path (rynn-teleop run --mode digital --policy PATH; "
                                         f"launch policy:=PATH) or {backend}.{key}")
        return values

    # ------------------------------------------------------------------ operator and safety
    def _srv_start(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = self.ctl.start(self.now_s())
        self._report()
        return response

    def _srv_stop(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = self.ctl.stop(self.now_s())
        self._report()
        return response

    def _on_estop(self, msg: Bool) -> None:
        if msg.data:
            self.ctl.estop(self.now_s(), "/estop")
            self._report()

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        now = None
        for status in msg.status:
            if status.name not in DRIVERS:
                continue
            try:
                driver = DriverStatus.decode({kv.key: kv.value for kv in status.values})
            except StatusError:
                continue  # another version's driver: it says so in its own health
            now = self.now_s() if now is None else now
            self.ctl.driver_report(status.name, driver.estop, now)
        if now is not None:
            self._report()

    def _report(self) -> None:
        """Log the controller's events; start and end the run's episode."""
        for event in self.ctl.take_events():
            self.log_at(event.level, event.text)
            if event.kind == "started" and self.params["record_episodes"]:
                self._start_episode()
            elif event.kind == "ended":
                self._stop_episode()

    # ------------------------------------------------------------------ episodes
    def _start_episode(self) -> None:
        client = self._recorder["start_episode"]
        if self._episode:
            self.get_logger().warning(f"the previous run's episode is still {self._episode}: this run is not "
                                      "recorded")
            return
        if not client.service_is_ready():
            self.get_logger().info("no recorder running: the run is not recorded")
            return
        self._episode, self._episode_stop_wanted = "starting", False
        client.call_async(Trigger.Request()).add_done_callback(self._on_episode_started)

    def _on_episode_started(self, future) -> None:  # the executor's thread
        with self.lock:
            response = _result(future)
            if response is None or not response.success:
                why = "no answer" if response is None else response.message
                self.get_logger().warning(f"the recorder started no episode for this run: {why}")
                self._episode = ""
                return
            self._episode = "recording"
            self.get_logger().info(f"recording the run: {response.message}")
            if self._episode_stop_wanted:
                self._stop_episode()

    def _stop_episode(self) -> None:
        if self._episode == "starting":
            self._episode_stop_wanted = True
            return
        if self._episode != "recording":
            return
        self._episode = "stopping"
        self._recorder["stop_episode"].call_async(Trigger.Request()).add_done_callback(self._on_episode_stopped)

    def _on_episode_stopped(self, future) -> None:  # the executor's thread
        with self.lock:
            self._episode = ""
            response = _result(future)
            if response is None or not response.success:
                why = "no answer" if response is None else response.message
                self.get_logger().error(f"the recorder did not keep the run's episode: {why}")
            else:
                self.get_logger().info(f"the run's episode is kept: {response.message}")

    # ------------------------------------------------------------------ loops
    def _arm_tick(self) -> None:
        now_time = self.get_clock().now()
        now = now_time.nanoseconds * 1e-9
        for taken in self.take_all(self._js_sub):
            try:
                stamp_ns, names, position = joint_state(taken.message, self._names_cache)
            except ValueError:
                self.malformed_joint_states += 1
                continue
            if len(self._names_cache) > 64:
                self._names_cache.clear()
            self.ctl.measure(names, position, stamp_ns * 1e-9)
            self._states.append((names, position, stamp_ns))
        command = self.ctl.arm_step(now)
        if command is not None:
            msg = self._arm_msg
            msg.header.stamp = now_time.to_msg()
            msg.position = command.position.tolist()
            msg.velocity = command.velocity.tolist()
            self._arm_pub.publish(msg)
            self.meter("command").tick(now)
        hands = self.ctl.hand_step()
        if hands is not None and now >= self._hand_due - 0.5 * self._arm_period:  # hand_rate_hz on average
            self._hand_due = max(self._hand_due + self._hand_period, now)  # a pause is not caught up in a burst
            for part, msg in self._hand_msgs:
                msg.header.stamp = now_time.to_msg()
                msg.position = hands[part].tolist()
                self._hand_pub.publish(msg)
        self._report()

    def _policy_tick(self) -> None:
        for camera, sub in self._camera_subs.items():
            for taken in self.take_all(sub):
                stamp = taken.message.header.stamp
                self.ctl.frame(camera, stamp.sec + stamp.nanosec * 1e-9)
                self._pending[camera].append(taken.message)
        decision = self.ctl.policy_tick(self.now_s())
        if decision.act:
            frames = {c: list(q) for c, q in self._pending.items()}
            if self._inference.submit(lambda: self._act(decision.generation, frames)):
                for q in self._pending.values():
                    q.clear()
            else:
                self.ctl.overrun()
        self._report()

    def _act(self, run: int, frames: dict[str, list]) -> None:
        """The inference thread: the observation of the newest frame, then the policy's action for it."""
        try:
            if self._reset_run != run:  # the first action of a run: the policy forgets the previous run
                self.runner.reset()
                self._reset_run = run
            while self._states:
                names, position, stamp_ns = self._states.popleft()
                self.builder.add_joint_state(names, position, stamp_ns)
            for camera, messages in frames.items():
                for msg in messages:
                    stamp = msg.header.stamp
                    self.builder.add_image(camera, image_array(msg), stamp.sec * 1_000_000_000 + stamp.nanosec)
            observation = self.builder.build()
            if observation is None:
                with self.lock:
                    self.no_observation += 1
                return
            started = time.perf_counter()
            action = self.runner.act(observation.values)
            took = time.perf_counter() - started
        except PolicyError as exc:
            self._failed(str(exc), fatal=not exc.alive)
            return
        except Exception as exc:  # noqa: BLE001 - a policy's failure ends the run; the node stays up
            self._failed(f"{type(exc).__name__}: {exc}", fatal=False)
            return
        with self.lock:
            now = self.now_s()
            self.meter(POLICY_METER).tick(now, took)
            self.ctl.take_action(run, action, now)
            self._report()

    def _inference_error(self, exc: BaseException) -> None:
        self.loop_exceptions.append(exc)
        self.get_logger().error(f"the inference thread raised: {exc!r}")

    def _failed(self, message: str, *, fatal: bool) -> None:
        with self.lock:
            self.ctl.fail(self.now_s(), message, fatal=fatal)
            self._report()

    # ------------------------------------------------------------------ diagnostics
    def policy_status(self) -> PolicyStatus:
        """The node's typed status (what the console and ``rynn-teleop call status`` read)."""
        st = self.ctl.status()
        return PolicyStatus(state=st.state, reason=st.reason, backend=self.params["backend"], source=self.spec.source,
                            fps=float(self.spec.fps), run=st.generation, steps=st.steps, overruns=st.overruns,
                            last_error=st.last_error, recording=self._episode in ("starting", "recording"))

    def diagnostic_values(self):
        st = self.ctl.status()
        return self.policy_status().values({
            "commanding": st.commanding, "discarded_actions": st.discarded, "holds": st.holds, "errors": st.errors,
            "arm_targets_clipped": st.arm_targets_clipped, "hand_commands_limited": st.hand_commands_limited,
            "no_observation": self.no_observation, "joint_states_unreadable": self.malformed_joint_states,
            "joint_states_rejected": self.ctl.measured.rejected, "ruckig_errors": self.ctl.follower.errors,
        })

    def diagnostic_level(self):
        st = self.ctl.status()
        if st.state == "error":
            return DiagnosticStatus.ERROR, st.reason
        if st.state == "estopped":
            return DiagnosticStatus.WARN, f"e-stop: {st.reason}"
        if st.state == "holding":
            return DiagnosticStatus.WARN, f"holding: {st.reason}"
        if st.state == "running":
            return DiagnosticStatus.OK, f"running (run {st.generation}, {st.steps} steps)"
        return DiagnosticStatus.OK, f"idle ({st.reason})" if st.reason else "idle"


def _result(future) -> Any:
    """A service call's response; None when it failed (the middleware, a shutdown)."""
    try:
        return future.result()
    except Exception:  # noqa: BLE001 - reported by the caller as "no answer"
        return None


def main(args=None) -> int:
    return run_single(PolicyNode, args)

