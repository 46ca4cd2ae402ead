"""What the arm and hand driver nodes share: the control loop around a backend and the safety layer.

Every cycle (``rate_hz``, a :class:`~.base.ControlLoop` on wall-clock deadlines): read the backend, publish
the measurement on ``/joint_states``, let ``core.safety.SafetyController`` decide the target (watchdog,
e-stop latch, start-up hold and ramp, clamping) and write it. Topics and services: :data:`DRIVER_IO`.
Status in /diagnostics: ``core.status.DriverStatus`` (backend, lifecycle state, mode, e-stop, what latched it,
faults), which the console and ``rynn-teleop call status`` read; counters beside it.

The drivers are managed nodes (``nodes.lifecycle``; the states and transitions: ``core.lifecycle``). They start
unconfigured, the backend built but not connected; configure connects it and starts the cycle without writes
(read and publish only: inactive), activate enables it and follows commands, deactivate stops and disables it,
cleanup closes it. ``rynn-teleop run`` and the launch file's ``lifecycle_manager`` bring them to active in
order. The e-stop (topic and service) latches in every state; ``~/reset`` releases it only when active.
"""

from __future__ import annotations

import array
from typing import Any, NamedTuple

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool
from std_srvs.srv import Trigger

from ..core.node_io import NodeIO, QoS, Service, Topic
from ..core.params import Param
from ..core.robot_model import JointLimits, RobotModel
from ..core.safety import SafetyController
from ..core.status import DriverStatus
from ..hardware.base import JointBackend
from ..recording.cdr import joint_state
from .lifecycle import ManagedNode

# distinct name lists remembered by JointDriverNode.accept_command (the cache is emptied when full)
ROUTE_CACHE_SIZE = 64

# 200: a second of history at 200 Hz for a subscriber that falls behind (the recorder on a loaded machine)
COMMAND_QOS = QoS(200)

#: the topics and services of every driver node
DRIVER_IO = NodeIO(
    publishers=(Topic("/joint_states", "sensor_msgs/msg/JointState", COMMAND_QOS,
                      "this driver's joints, measured (position, and velocity and effort where the backend gives "
                      "them), stamped at capture, at rate_hz"),),
    subscriptions=(
        Topic("{command_topic}", "sensor_msgs/msg/JointState", COMMAND_QOS,
              "commands: positions by joint name (joints of other drivers ignored), drained at each cycle"),
        Topic("/estop", "std_msgs/msg/Bool", QoS(10), "true latches the e-stop of every driver"),
    ),
    services=(
        Service("~/estop", "std_srvs/srv/Trigger", "latch the e-stop (the backend stops within this call)"),
        Service("~/reset", "std_srvs/srv/Trigger", "release it (motion resumes, ramped, with fresh commands)"),
    ),
)


def safety_params(rate_hz: float, timeout: float) -> list[Param]:
    """Parameters every driver declares (defaults per driver)."""
    return [
        Param("rate_hz", float, rate_hz, "control and /joint_states rate", "Hz", min=10.0, max=1000.0),
        Param("command_timeout_s", float, timeout, "watchdog: no command for this long -> hold the measured position",
              "s", min=0.01, max=5.0),
        Param("ramp_threshold", float, 0.05, "a command further than this from the held position is ramped to",
              "rad", min=0.0, max=3.0),
        Param("ramp_speed", float, 0.2, "ramp speed as a fraction of the velocity limits", min=0.01, max=1.0),
        Param("velocity_scale", float, 1.0, "max step per cycle = this x velocity limit x cycle time",
              min=0.01, max=1.0),
    ]


class _Route(NamedTuple):
    """Where the positions of a command with a given list of names go (see JointDriverNode.accept_command)."""

    valid: bool  # the names are distinct
    joints: slice | np.ndarray | None  # the driver's joints named, in the command's order (None: none)
    select: np.ndarray | None  # the command's entries for ``joints`` (None: all of them)
    unknown: tuple[str, ...]  # names that are not the driver's joints


class JointDriverNode(ManagedNode):
    """Base of the driver nodes: subclasses build :attr:`backend` (their ``backend`` parameter's, from the
    registry of their :class:`~rynn_teleop.core.plugins.BackendSchema`) and call :meth:`_start`; the lifecycle
    transitions connect, enable, disable and close it (module docstring)."""
    PRIORITY = "control"  # the hardware's command and state loop

    def _start(self, robot: RobotModel, backend: JointBackend) -> None:
        p = self.params
        self.robot = robot
        self.backend = backend
        self.names = list(backend.joint_names)
        self._index = {n: i for i, n in enumerate(self.names)}
        self._routes: dict[tuple[str, ...], _Route] = {}
        idx = robot.indices(self.names)
        lim = robot.limits[idx]
        self.limits = JointLimits(lim.lower, lim.upper, lim.velocity * p["velocity_scale"], lim.acceleration, lim.jerk)
        self.safety = SafetyController(
            self.names, self.limits, 1.0 / p["rate_hz"], command_timeout=p["command_timeout_s"],
            ramp_threshold=p["ramp_threshold"], ramp_speed=p["ramp_speed"],
        )
        self.unknown_names: set[str] = set()
        self.rejected_commands = 0
        self.ignored_commands = 0  # commands that arrived while not active (dropped)
        self.loop_errors = 0
        self._fault = ""  # why the driver latched the e-stop itself (backend fault or exception)
        self._connected = False  # configured: the backend is connected, the cycle reads and publishes
        self._commanding = False  # active: the cycle follows commands and writes targets
        self._js_pub = self.io_publisher("/joint_states")
        self._js_msg = JointState(name=self.names)
        self._no_values = array.array("d")  # the message's velocity / effort when the backend gives none
        # drained at each cycle (the newest command wins there anyway): no executor wake-up per command; taken
        # as CDR bytes, of which only the names and positions are read (recording.cdr.joint_state)
        self._command_sub = self.io_polled_subscription("{command_topic}", raw=True)
        self._command_names: dict[bytes, tuple[str, ...]] = {}  # the name lists seen, decoded once
        self.io_subscription("/estop", self._on_estop_topic)
        self.io_service("~/estop", self._srv_estop)
        self.io_service("~/reset", self._srv_reset)
        self.last_reading = None
        self._js_meter = self.meter("joint_states", nominal_hz=p["rate_hz"])
        self._loop = self.create_loop(p["rate_hz"], self._tick, "control")

    # ------------------------------------------------------------------ lifecycle (core.lifecycle)
    def configure_node(self) -> None:
        """Connect the backend; the cycle then reads and publishes the measurement, and writes nothing.

        Raises:
            HardwareUnavailableError: from the backend, naming what is missing (it is closed again).
        """
        try:
            self.backend.connect()
        except BaseException:
            self._close_backend()  # do not leak a half-opened controller / device
            raise
        self._connected = True

    def activate_node(self) -> None:
        """Enable the backend (it holds the measured position) and follow the commands received from now on,
        ramped when far. While the e-stop is latched the backend is not enabled: ``~/reset`` does that."""
        if not self.safety.estopped:
            try:
                self.backend.enable()
            except BaseException:
                self._quietly("disabling the backend after a failed enable", self.backend.disable)
                raise
        self.safety.restart(self.now_s())  # nothing received before now is followed
        self._commanding = True

    def deactivate_node(self) -> None:
        """Stop commanding: the backend's soft stop, then disable it (servos off; a Wuji hand goes limp). A
        disable that fails latches the e-stop naming why (the node is inactive regardless: nothing is written)."""
        self._commanding = False
        self.safety.restart(self.now_s())
        self._quietly("backend stop", self.backend.stop)
        try:
            self.backend.disable()
        except Exception as exc:  # noqa: BLE001 - reported as the e-stop's cause, see above
            self._fault = f"disable failed: {exc}"
            self._latch_estop(self._fault)

    def cleanup_node(self) -> None:
        """Close the backend (disconnect); ``/joint_states`` stops."""
        self._connected = False
        self._close_backend()

    def shutdown_node(self) -> None:
        """From any state: stop and close the backend."""
        self._commanding = self._connected = False
        self._close_backend()

    def _close_backend(self) -> None:
        self._quietly("backend stop", self.backend.stop)  # soft stop first: the arms may be moving
        self._quietly("closing the backend", self.backend.close)

    def _quietly(self, what: str, call) -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - going down regardless; the error is logged
            self.get_logger().error(f"{what} failed: {exc!r}")

    # ------------------------------------------------------------------ commands
    def _drop_commands(self) -> None:
        """Take and drop the commands waiting (not active: nothing is followed), counting them."""
        for _ in self.take_all(self._command_sub):
            self.ignored_commands += 1

    def _take_commands(self, now: float) -> None:
        """Hand the commands received since the last cycle to the safety controller, in order, each at the
        time the middleware received it."""
        for taken in self.take_all(self._command_sub):
            try:
                _, names, position = joint_state(taken.message, self._command_names)
            except ValueError:
                self.rejected_commands += 1
                continue
            if len(self._command_names) > ROUTE_CACHE_SIZE:
                self._command_names.clear()
            self.accept_command(names, position, min(now, taken.received_ns * 1e-9))

    def accept_command(self, names, positions, now: float) -> bool:
        """A (partial) command by joint name; joints it does not name keep their own freshness.

        False (counted) if malformed: lengths differ, a value is not finite, a name repeats. False (not
        counted) if it names none of the driver's joints; names that are not the driver's are remembered
        (:attr:`unknown_names`). False (counted in :attr:`ignored_commands`) while the node is not active.
        """
        if not self._commanding:
            self.ignored_commands += 1
            return False
        pos = np.asarray(positions, dtype=float)
        if pos.shape != (len(names),) or np.count_nonzero(np.isfinite(pos)) != pos.size:
            self.rejected_commands += 1
            return False
        key = tuple(names)
        route = self._routes.get(key)
        if route is None:
            route = self._route(key)
        if not route.valid:
            self.rejected_commands += 1
            return False
        if route.unknown:
            self.unknown_names.update(route.unknown)
        if route.joints is None:
            return False
        self.safety.command(pos if route.select is None else pos[route.select], now, route.joints)
        return True

    def _route(self, names: tuple[str, ...]) -> _Route:
        """The :class:`_Route` of a command naming ``names`` (remembered)."""
        if len(set(names)) != len(names):
            route = _Route(False, None, None, ())
        else:
            index = [self._index.get(name) for name in names]
            known = [k for k, i in enumerate(index) if i is not None]
            joints = [index[k] for k in known]
            unknown = tuple(name for name, i in zip(names, index) if i is None)
            if not joints:
                route = _Route(True, None, None, unknown)
            else:
                select = None if len(known) == len(names) else np.array(known)
                if joints == list(range(joints[0], joints[0] + len(joints))):
                    route = _Route(True, slice(joints[0], joints[0] + len(joints)), select, unknown)
                else:
                    route = _Route(True, np.array(joints), select, unknown)
        if len(self._routes) >= ROUTE_CACHE_SIZE:
            self._routes.clear()
        self._routes[names] = route
        return route

    # ------------------------------------------------------------------ e-stop
    def _latch_estop(self, why: str) -> bool:
        new = self.safety.estop()
        try:
            self.backend.stop()
        except Exception as exc:  # noqa: BLE001 - the latch holds regardless
            self.get_logger().error(f"backend stop failed: {exc!r}")
        if new:
            self.get_logger().error(f"E-STOP latched ({why})")
        return new

    def _on_estop_topic(self, msg: Bool) -> None:
        if msg.data:
            self._latch_estop("/estop topic")

    def _srv_estop(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        new = self._latch_estop("~/estop service")
        response.success, response.message = True, "e-stop latched" if new else "e-stop was already latched"
        return response

    def _srv_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if not self._commanding:
            response.success = False
            response.message = (f"{self.get_name()} is {self.lifecycle_state}: the e-stop is released only when "
                                f"active (activate it first: ros2 lifecycle set {self.get_fully_qualified_name()} "
                                "activate)")
            return response
        if not self.safety.estopped:
            response.success, response.message = True, "e-stop was not latched"
            return response
        faults = self.backend.faults()
        if faults:
            response.success, response.message = False, f"backend faults remain: {'; '.join(faults)}"
            return response
        try:
            self.backend.enable()
        except Exception as exc:  # noqa: BLE001 - report, stay latched
            response.success, response.message = False, f"re-enabling the backend failed: {exc}"
            return response
        self._fault = ""
        self.safety.reset(self.now_s())
        self.get_logger().warning("e-stop reset: following fresh commands again (ramped)")
        response.success, response.message = True, "e-stop reset; motion resumes with fresh commands"
        return response

    # ------------------------------------------------------------------ cycle
    def _tick(self) -> None:
        """One control cycle, while configured. An exception (backend read/write) latches the e-stop and stops
        the backend, but never ends the timer: the node stays up and its e-stop/reset stay reachable."""
        if not self._connected:
            return
        try:
            self._cycle()
        except Exception as exc:  # noqa: BLE001 - see above
            self.loop_errors += 1
            self._fault = f"control loop error: {exc!r}"
            if self._latch_estop(self._fault) or self.loop_errors == 1:
                self.get_logger().error(self._fault)

    def _cycle(self) -> None:
        now_time = self.get_clock().now()
        now = now_time.nanoseconds * 1e-9
        if self._commanding:
            self._take_commands(now)
        else:
            self._drop_commands()
        faults = self.backend.faults()
        if faults and not self.safety.estopped:
            self._fault = "; ".join(faults)
            self._latch_estop(f"backend fault: {self._fault}")
        reading = self.backend.read(now)
        self.last_reading = reading
        if self.backend.discontinuity():  # a simulation reset moved the joints: start again from the measurement
            self.safety.restart(now)
        msg = self._js_msg  # reused: names fixed, values and stamp replaced each cycle
        # array.array('d'): taken by the message as it is (a list would be checked value by value)
        msg.position = array.array("d", reading.position.tolist())
        msg.velocity = array.array("d", reading.velocity.tolist()) if reading.velocity is not None else self._no_values
        msg.effort = array.array("d", reading.effort.tolist()) if reading.effort is not None else self._no_values
        stamp = msg.header.stamp
        stamp.sec, stamp.nanosec = divmod(int(round(reading.stamp * 1e9)), 1_000_000_000)
        self._js_pub.publish(msg)
        self.publish_extra(msg)
        if self._commanding:  # inactive: measured and published, nothing written (ros2_control's inactive)
            out = self.safety.step(now, reading.position)
            if not self.safety.estopped and out.target is not None:
                self.backend.write(out.target)
        self._js_meter.tick(now)

    def publish_extra(self, joint_states: JointState) -> None:
        """Hook for additional topics (the hand driver's vendor-shaped ones)."""

    # ------------------------------------------------------------------ diagnostics
    def driver_status(self) -> DriverStatus:
        """The driver's typed status (what the console and ``rynn-teleop call status`` read)."""
        return DriverStatus(backend=self.backend.name, lifecycle=self.lifecycle_state,
                            lifecycle_error=self.lifecycle_error, mode=self.safety.mode, estop=self.safety.estopped,
                            latched_by=self._fault, faults=tuple(self.backend.faults()))

    def diagnostic_values(self) -> dict[str, Any]:
        s = self.safety
        values = {
            "watchdog_tripped": s.watchdog.tripped,
            "watchdog_trips": s.watchdog.trips,
            "clamped_position_cycles": s.clamp_counts["position"],
            "clamped_step_cycles": s.clamp_counts["step"],
            "rejected_commands": self.rejected_commands,
            "ignored_commands": self.ignored_commands,
            "loop_errors": self.loop_errors,
        }
        if self.unknown_names:
            values["unknown_command_names"] = ",".join(sorted(self.unknown_names))[:200]
        values.update({f"backend.{k}": v for k, v in self.backend.status().items()})
        return self.driver_status().values(values)

    def diagnostic_level(self):
        state = self.lifecycle_state
        if self.transition_error is not None:
            return DiagnosticStatus.ERROR, f"{self.lifecycle_error} (now {state})"
        faults = self.backend.faults()
        if faults:
            return DiagnosticStatus.ERROR, "; ".join(faults)
        if self.safety.estopped:
            return DiagnosticStatus.ERROR, f"e-stop latched{' by ' + self._fault if self._fault else ''} (call ~/reset)"
        if not self._commanding:
            doing = "connected, commanding nothing" if self._connected else "not connected"
            return DiagnosticStatus.WARN, f"{state}: {doing}"
        if self.safety.mode == "watchdog":
            return DiagnosticStatus.WARN, "no fresh commands: holding"
        return DiagnosticStatus.OK, self.safety.mode

    def destroy_node(self) -> None:
        self.stop_loops()  # no tick may use what is closed below
        self._commanding = self._connected = False
        backend = getattr(self, "backend", None)
        if backend is not None:
            try:
                backend.stop()  # soft stop first: the arms may be moving
                backend.close()
            except Exception as exc:  # noqa: BLE001 - shutting down regardless
                self.get_logger().error(f"closing the backend failed: {exc}")
        super().destroy_node()

