"""TIANJI "Marvin" M6 arms through the vendor's Python wrapper ``fx_robot.py`` (ROS-free).

The vendor SDK is not on PyPI: labs have its ``SDK_PYTHON`` folder (``fx_robot.py`` next to
``libMarvinSDK.so``, which the wrapper loads from its own directory). :class:`MarvinBackend` imports
``fx_robot`` from :attr:`MarvinConfig.sdk_path` in :meth:`MarvinBackend.connect`, never at import time,
so this module imports everywhere.

Units: the controller speaks DEGREES (positions) and deg/s (velocities); everything crossing
:class:`~rynn_teleop.hardware.base.JointBackend` is SI (rad, rad/s, N·m). :func:`to_vendor` is the one
place targets are converted, and returns exactly what is sent. The controller drives two arms, ``'A'``
(feedback index 0) and ``'B'`` (index 1); :attr:`MarvinConfig.arm_map` says which side each is.
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np

from ..core.layout import N_ARM, SIDES
from ..core.params import STR_LIST, Param
from ..core.robot_model import arm_joint_names
from ..core.settings import Settings, setting
from ..errors import ConfigurationError, HardwareUnavailableError
from .base import ARM_BACKENDS, DriverContext, JointBackend, JointReading

_LOG = logging.getLogger(__name__)

ARMS = ("A", "B")
ARM_INDEX: Mapping[str, int] = MappingProxyType({"A": 0, "B": 1})  # index into the feedback's states / outputs
DEFAULT_ARM_MAP: Mapping[str, str] = MappingProxyType({"left": "A", "right": "B"})
EFFORT_FIELDS = ("fb_joint_sToq", "est_joint_force")  # both [N·m]

# Controller states (set_state / cur_state)
STATE_IDLE = 0  # servo off
STATE_POSITION = 1  # position follow
STATE_ERROR = 100  # cur_state only
STATE_NAMES: Mapping[int, str] = MappingProxyType(
    {0: "idle", 1: "position", 2: "pvt", 3: "torque", 4: "release", 100: "error"}
)

FEEDBACK_CHECK_READS = 10  # subscribe() reads when confirming that UDP feedback flows
FEEDBACK_CHECK_PERIOD = 0.010  # [s] between those reads
SERVO_ERROR_PERIOD = 1.0  # [s] min. time between get_servo_error_code() polls (status())
MAX_STREAM_HZ = 200.0  # [Hz] the controller's position-follow streaming limit
RATE_BURST = 2.0  # [targets] token-bucket capacity: a late tick's target and the early next one may go back to back
RATE_TOLERANCE = 0.05  # [tokens] a send may leave the bucket this far below empty (clock rounding / timer jitter)

_T = TypeVar("_T")

_SDK_HINT = (
    "the parameter `sdk_path` must point to the Marvin SDK's SDK_PYTHON folder "
    "(containing fx_robot.py and libMarvinSDK.so)"
)


# ---------------------------------------------------------------------- pure conversions
def to_vendor(position: np.ndarray, sides: Sequence[str], arm_map: Mapping[str, str]) -> dict[str, list[float]]:
    """Joint targets in the backend's order -> the per-arm lists given to ``set_joint_cmd_pose``.

    Args:
        position: (7 * len(sides),) targets [rad], ``sides`` order, 7 joints each.
        sides: the sides in use, e.g. ``("left", "right")``.
        arm_map: side -> controller arm letter (``'A'`` / ``'B'``).
    Returns:
        ``{arm letter: [7 targets in DEGREES]}``, in ``sides`` order: exactly what is sent.
    Raises:
        ValueError: wrong shape, or a target that is not finite.
        ConfigurationError: a side missing from ``arm_map``.
    """
    q = np.asarray(position, dtype=float)
    if q.shape != (N_ARM * len(sides),):
        raise ValueError(f"marvin: expected ({N_ARM * len(sides)},) joint targets [rad], got shape {q.shape}")
    if not np.all(np.isfinite(q)):
        raise ValueError(f"marvin: refusing non-finite joint targets {q.tolist()}")
    out: dict[str, list[float]] = {}
    for k, side in enumerate(sides):
        if side not in arm_map:
            raise ConfigurationError(f"marvin: arm_map has no arm for side {side!r}")
        out[arm_map[side]] = [math.degrees(float(v)) for v in q[k * N_ARM : (k + 1) * N_ARM]]
    return out


class ArmFeedback(NamedTuple):
    """One arm's part of a ``subscribe()`` sample, in SI units (vendor degrees kept for holding)."""

    frame_serial: int  # controller frame counter (counts up while UDP feedback flows)
    position_deg: list[float]  # (7,) measured positions as received [deg]
    position: np.ndarray  # (7,) [rad]
    velocity: np.ndarray | None  # (7,) [rad/s]; None if the sample lacks fb_joint_vel
    effort: np.ndarray | None  # (7,) [N·m] from the chosen effort field; None if absent
    max_temperature: float | None  # hottest joint (fb_joint_them) [°C]
    cur_state: int | None  # controller state (100 = error); None if the sample has no states
    cmd_state: int | None
    err_code: int | None


def parse_feedback(sample: Mapping[str, Any], arm: str, effort_field: str = "fb_joint_sToq") -> ArmFeedback:
    """Arm ``arm``'s feedback from one ``robot.subscribe(dcss)`` dict (degrees -> radians).

    Raises:
        HardwareUnavailableError: the sample lacks the arm's outputs or its 7 positions.
    """
    index = ARM_INDEX[arm]
    try:
        out = sample["outputs"][index]
        pos_deg = [float(v) for v in out["fb_joint_pos"]]
        serial = int(out["frame_serial"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise HardwareUnavailableError(
            f"marvin: unexpected feedback layout for arm {arm} ({type(exc).__name__}: {exc}); "
            "is the SDK at `sdk_path` the Marvin SDK?"
        ) from exc
    if len(pos_deg) != N_ARM:
        raise HardwareUnavailableError(f"marvin: arm {arm} reports {len(pos_deg)} joint positions, expected {N_ARM}")

    def seven(key: str, scale: float = 1.0) -> np.ndarray | None:
        values = out.get(key)
        if values is None or len(values) != N_ARM:
            return None
        return np.asarray(values, dtype=float) * scale

    temps = seven("fb_joint_them")
    states = sample.get("states")
    state = states[index] if isinstance(states, Sequence) and len(states) > index else {}
    return ArmFeedback(
        frame_serial=serial,
        position_deg=pos_deg,
        position=np.radians(pos_deg),
        velocity=seven("fb_joint_vel", math.pi / 180.0),
        effort=seven(effort_field),
        max_temperature=float(np.max(temps)) if temps is not None else None,
        cur_state=_opt_int(state.get("cur_state")),
        cmd_state=_opt_int(state.get("cmd_state")),
        err_code=_opt_int(state.get("err_code")),
    )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _in_error(fb: ArmFeedback) -> bool:
    return fb.cur_state == STATE_ERROR or bool(fb.err_code)


# ---------------------------------------------------------------------- settings
def _ipv4_problem(text: str) -> str | None:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return "is not an IPv4 address like 192.168.1.190"
    return None


def _sides_problem(sides: list[str]) -> str | None:
    return None if sides and len(set(sides)) == len(sides) else "must be distinct sides, at least one"


@dataclass(frozen=True)
class MarvinConfig(Settings):
    """Settings of a :class:`MarvinBackend`, validated on construction.

    Attributes:
        sdk_path: the Marvin SDK's ``SDK_PYTHON`` folder (``fx_robot.py`` and ``libMarvinSDK.so``); checked by
            :meth:`MarvinBackend.connect`, not here.
        ip: controller IPv4 address.
        arm_map: side -> controller arm (``'A'`` / ``'B'``), a different arm for each side in use (the default,
            left = A and right = B, is not verified on the real robot). Stored read-only.
        sides: sides in use and their order in the joint vector (7 joints each); stored as a tuple.
        vel_ratio: controller joint velocity limit [% of max, 1-100] (sent rounded to an integer).
        acc_ratio: controller joint acceleration limit [% of max, 1-100] (sent rounded to an integer).
        feedback_timeout: a frame_serial unchanged this long is a fault [s] (> 0).
        rate_limit_hz: most targets sent per second on average [Hz] (> 0; the backend lowers a value above
            :data:`MAX_STREAM_HZ` to it, with a warning).
        module_name: the wrapper module inside ``sdk_path`` (a Python identifier).
        effort_field: feedback field published as effort, both [N·m]: ``"fb_joint_sToq"``, the joint torque
            sensors (the whole joint torque, gravity included), or ``"est_joint_force"``, the controller's
            estimate of the EXTERNAL joint torque. (``fb_joint_cToq`` is motor current in per mille of the
            rated current, not a torque, and is not offered.)

    Raises:
        ParameterError: an invalid field (a :class:`~rynn_teleop.errors.ConfigurationError`); ``key`` and the
            message name it and its allowed values (the fields are declared as :mod:`~rynn_teleop.core.settings`).
    """

    SETTINGS_NAME: ClassVar[str] = "marvin"

    sdk_path: str = setting(description="the SDK's SDK_PYTHON folder (fx_robot.py, libMarvinSDK.so)", type=str)
    ip: str = setting("192.168.1.190", "controller address (IPv4)", check=_ipv4_problem)
    arm_map: Mapping[str, str] = field(default_factory=lambda: DEFAULT_ARM_MAP)
    sides: tuple[str, ...] = setting(SIDES, "sides in use, in joint-vector order", type=STR_LIST, choices=SIDES,
                                     check=_sides_problem)
    vel_ratio: float = setting(30.0, "controller joint velocity limit", units="%", min=1.0, max=100.0)
    acc_ratio: float = setting(30.0, "controller joint acceleration limit", units="%", min=1.0, max=100.0)
    feedback_timeout: float = setting(1.0, "a frame_serial unchanged this long is a fault", units="s", min=0.001,
                                      max=3600.0)
    rate_limit_hz: float = setting(200.0, "most targets sent per second on average", units="Hz", min=0.001,
                                   max=1e6)
    module_name: str = setting("fx_robot", "the wrapper module inside sdk_path",
                               check=lambda v: None if v.isidentifier() else "is not a Python module name")
    effort_field: str = setting("fb_joint_sToq", "feedback field published as effort", choices=EFFORT_FIELDS)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "arm_map", MappingProxyType(dict(self.arm_map)))

    def _problems(self) -> Iterator[tuple[str, str]]:
        try:
            arm_map = dict(self.arm_map)
        except (TypeError, ValueError):
            yield "arm_map", f"{self.arm_map!r} is not a mapping side -> 'A' / 'B'"
            return
        missing = [s for s in self.sides if s not in arm_map]
        if missing:
            yield "arm_map", f"{arm_map!r} has no arm for side(s) {missing}"
        arms = tuple(arm_map.get(s) for s in self.sides)
        if any(a not in ARMS for a in arms) or len(set(arms)) != len(arms):
            yield "arm_map", f"{arm_map!r} must map each side to a different arm, 'A' or 'B'"

    @property
    def arms(self) -> tuple[str, ...]:
        """The controller arm of each side in use, in ``sides`` order."""
        return tuple(self.arm_map[s] for s in self.sides)


# ---------------------------------------------------------------------- backend
@ARM_BACKENDS.register
class MarvinBackend(JointBackend):
    """Both (or one) Marvin M6 arms of one controller (``name = "marvin"``).

    Joints: ``arm_joint_names(side)`` for each side in ``sides`` order (7 each).
    Life cycle as :class:`JointBackend`; :meth:`write` sends only between
    :meth:`enable` and :meth:`stop` / :meth:`disable`.

    Attributes:
        config: the settings (:class:`MarvinConfig`).
        sides, arms: the sides in use and the controller arm of each, in joint-vector order.
        arm_map: side -> controller arm, for the sides in use only.
        vel_ratio, acc_ratio: the limits sent to the controller [% of max], rounded to integers.
        rate_limit_hz: the token bucket's refill rate [Hz]: ``config.rate_limit_hz``, at most ``MAX_STREAM_HZ``.
        sent_writes, skipped_writes, refused_writes, failed_sends: write counters (see :meth:`status`).
    """

    name = "marvin"
    SETTINGS = (
        Param("sdk_path", str, "", "the SDK's SDK_PYTHON folder (fx_robot.py, libMarvinSDK.so)"),
        Param("ip", str, "192.168.1.190", "controller address", check=_ipv4_problem),
        Param("arm_a_side", str, "left", "which side the controller's arm 'A' is", choices=SIDES),
        Param("vel_ratio", float, 30.0, "controller velocity ratio", "%", min=1.0, max=100.0),
        Param("acc_ratio", float, 30.0, "controller acceleration ratio", "%", min=1.0, max=100.0),
    )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: DriverContext) -> MarvinBackend:
        """Both arms of one controller, targets rate-limited to the node's control rate."""
        a = settings["arm_a_side"]
        return cls(MarvinConfig(settings["sdk_path"], ip=settings["ip"], sides=context.sides,
                                arm_map={a: "A", ("right" if a == "left" else "left"): "B"},
                                vel_ratio=settings["vel_ratio"], acc_ratio=settings["acc_ratio"],
                                rate_limit_hz=context.rate_hz),
                   clock=context.clock or time.monotonic)

    def __init__(
        self,
        config: MarvinConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """
        Args:
            config: the settings (validated when the :class:`MarvinConfig` was built).
            clock: monotonic time [s] for rate limiting and the servo-error poll (tests inject one).
            sleep: sleeps [s] between the feedback checks of :meth:`connect` (tests inject one).
        """
        self.config = config
        self.sides = config.sides
        self.arms = config.arms  # controller arm per side, in ``sides`` order
        self.arm_map: Mapping[str, str] = MappingProxyType({s: config.arm_map[s] for s in config.sides})
        self.vel_ratio = round(config.vel_ratio)  # [%] the wrapper passes it through ctypes.c_int: must be an int
        self.acc_ratio = round(config.acc_ratio)  # [%]
        if config.rate_limit_hz > MAX_STREAM_HZ:
            _LOG.warning(
                "marvin: rate_limit_hz %g is above the controller's %g Hz streaming limit; sending at most %g Hz",
                config.rate_limit_hz,
                MAX_STREAM_HZ,
                MAX_STREAM_HZ,
            )
        self.rate_limit_hz = min(float(config.rate_limit_hz), MAX_STREAM_HZ)  # [Hz] the token bucket's refill rate
        self.joint_names = tuple(n for s in config.sides for n in arm_joint_names(s))
        self._clock = clock
        self._sleep = sleep

        self._sdk: ModuleType | None = None
        self._robot: Any = None  # Marvin_Robot while connected
        self._dcss: Any = None
        self._enabled = False
        self._stopped = False
        self._refusal_logged = False
        self._tokens = RATE_BURST  # [targets] the rate limit's token bucket
        self._tokens_at: float | None = None  # clock() when the bucket was last refilled [s]
        self.sent_writes = 0
        self.skipped_writes = 0  # dropped by the rate limit (no token)
        self.refused_writes = 0  # not enabled, or stopped
        self.failed_sends = 0  # send_cmd() returned 0
        self._feedback: dict[str, ArmFeedback] = {}
        self._serial_changed_at: dict[str, tuple[int, float]] = {}  # arm -> (serial, now of its last change)
        self._stale: dict[str, float] = {}  # arm -> feedback age [s] once past the timeout
        self._stop_failed: str | None = None
        self._servo_errors: dict[str, Any] = {}
        self._servo_polled_at: float | None = None

    # ------------------------------------------------------------------ connection
    @property
    def connected(self) -> bool:
        return self._robot is not None

    def connect(self) -> None:
        """Import ``fx_robot`` from ``sdk_path``, connect to the controller and check its UDP feedback.

        Raises:
            HardwareUnavailableError: ``sdk_path`` is not a folder, the module is
                missing or fails to import / load ``libMarvinSDK.so``, the
                controller does not answer, or no feedback arrives.
        """
        if self._robot is not None:
            return
        sdk = self._import_sdk()
        dcss, robot = _vendor_call(
            lambda: (sdk.DCSS(), sdk.Marvin_Robot()),  # Marvin_Robot() loads libMarvinSDK.so (ctypes.CDLL)
            f"the Marvin SDK in {self.config.sdk_path} failed to load",
            "; is libMarvinSDK.so next to fx_robot.py (built for this machine)?",
        )
        ip = self.config.ip
        ok = _vendor_call(lambda: robot.connect(ip), f"cannot connect to the Marvin controller at {ip}")
        if not ok:
            raise HardwareUnavailableError(
                f"cannot connect to the Marvin controller at {ip} (connect returned {ok!r}); "
                "check the cable, that the controller is on and that this host can ping it"
            )
        try:
            self._check_feedback(robot, dcss)
        except BaseException:
            _release(robot)
            raise
        self._sdk, self._robot, self._dcss = sdk, robot, dcss
        self._enabled = False
        self._stopped = False
        self._serial_changed_at.clear()
        self._stale.clear()
        _LOG.info("marvin: connected to %s, arms %s", self.config.ip, dict(self.arm_map))

    def _import_sdk(self) -> ModuleType:
        folder_text = self.config.sdk_path or ""
        folder = Path(folder_text)
        if not folder_text or not folder.is_dir():
            raise HardwareUnavailableError(f"marvin: sdk_path {folder_text!r} is not a folder; {_SDK_HINT}")
        folder = folder.resolve()
        name = self.config.module_name
        if not (folder / f"{name}.py").is_file():
            raise HardwareUnavailableError(f"marvin: no {name}.py in {folder}; {_SDK_HINT}")
        cached = sys.modules.get(name)
        if cached is not None:
            if _module_dir(cached) == folder:
                return cached
            _LOG.warning(
                "marvin: replacing the already imported %s from %s by the one in %s", name, _module_dir(cached), folder
            )
            del sys.modules[name]
        entry = str(folder)
        sys.path.insert(0, entry)  # for the import only (the wrapper may import its sibling modules)
        try:
            importlib.invalidate_caches()
            module = importlib.import_module(name)
        except Exception as exc:  # ImportError, SyntaxError, OSError from a module-level CDLL, ...
            sys.modules.pop(name, None)
            raise HardwareUnavailableError(
                f"marvin: cannot import the module {name!r} from {folder} ({type(exc).__name__}: {exc}); {_SDK_HINT}"
            ) from exc
        finally:
            try:
                sys.path.remove(entry)
            except ValueError:
                pass
        missing = [attr for attr in ("Marvin_Robot", "DCSS") if not hasattr(module, attr)]
        if missing:
            raise HardwareUnavailableError(
                f"marvin: the module {name!r} in {folder} has no {', '.join(missing)}; {_SDK_HINT}"
            )
        return module

    def _check_feedback(self, robot: Any, dcss: Any) -> None:
        """Require every used arm's frame_serial to be non-zero and to change within ~10 reads."""
        first: dict[str, int] = {}
        moving: set[str] = set()
        for i in range(FEEDBACK_CHECK_READS):
            if i:
                self._sleep(FEEDBACK_CHECK_PERIOD)
            sample = robot.subscribe(dcss)
            for arm in self.arms:
                try:
                    serial = int(sample["outputs"][ARM_INDEX[arm]]["frame_serial"])
                except (KeyError, IndexError, TypeError, ValueError):
                    continue
                if serial == 0:
                    continue
                first.setdefault(arm, serial)
                if serial != first[arm]:
                    moving.add(arm)
            if moving == set(self.arms):
                return
        quiet = [a for a in self.arms if a not in moving]
        raise HardwareUnavailableError(
            f"connected to {self.config.ip} but no feedback arrives (UDP blocked by a firewall?): frame_serial of "
            f"arm(s) {', '.join(quiet)} is zero or unchanged over {FEEDBACK_CHECK_READS} reads "
            f"{FEEDBACK_CHECK_PERIOD * 1e3:.0f} ms apart"
        )

    def _require(self) -> Any:
        if self._robot is None:
            raise RuntimeError("MarvinBackend: call connect() first (or it was closed)")
        return self._robot

    def _subscribe(self) -> dict[str, ArmFeedback]:
        robot = self._require()
        sample = _vendor_call(
            lambda: robot.subscribe(self._dcss), f"marvin: reading feedback from {self.config.ip} failed"
        )
        fb = {arm: parse_feedback(sample, arm, self.config.effort_field) for arm in self.arms}
        self._feedback = fb
        return fb

    # ------------------------------------------------------------------ modes
    def enable(self) -> None:
        """Clear errors, hold the measured position, switch the arms to position follow.

        Sends the measured position (as received, in degrees) as the target
        before and together with ``set_state(arm, 1)`` and ``set_vel_acc``, so
        the arms hold still instead of running to a stale target. These two
        packets leave the rate limit's token bucket empty (the next target is
        sent once a token has refilled, about ``1 / rate_limit_hz`` later).
        """
        robot = self._require()
        self._clear_errors(robot)
        fb = self._subscribe()
        hold = {arm: list(fb[arm].position_deg) for arm in self.arms}
        robot.clear_set()
        for arm in self.arms:
            robot.set_joint_cmd_pose(arm, hold[arm])
        robot.send_cmd()
        robot.clear_set()
        for arm in self.arms:
            robot.set_state(arm, STATE_POSITION)
            robot.set_vel_acc(arm, self.vel_ratio, self.acc_ratio)
            robot.set_joint_cmd_pose(arm, hold[arm])
        robot.send_cmd()
        self._tokens, self._tokens_at = 0.0, self._clock()  # these packets used up the burst
        self._enabled = True
        self._stopped = False
        self._refusal_logged = False
        self._stop_failed = None
        _LOG.info(
            "marvin: arms %s in position follow (vel %d %%, acc %d %%), holding %s deg",
            ",".join(self.arms),
            self.vel_ratio,
            self.acc_ratio,
            hold,
        )

    def _clear_errors(self, robot: Any) -> None:
        if hasattr(robot, "check_error_and_clear"):
            robot.check_error_and_clear(self._dcss)  # the vendor's version clears one arm per call
        if not hasattr(robot, "clear_error"):
            return
        fb = self._subscribe()
        for arm in self.arms:
            if _in_error(fb[arm]):
                _LOG.warning(
                    "marvin: arm %s in error (state %s, err_code %s): clearing",
                    arm,
                    fb[arm].cur_state,
                    fb[arm].err_code,
                )
                robot.clear_error(arm)

    def read(self, now: float) -> JointReading:
        """Subscribe once; positions [rad], velocities [rad/s], effort [N·m] (see ``effort_field``); stamp ``now`` [s].

        Also updates the controller states and the staleness of each arm's
        frame_serial (unchanged for ``feedback_timeout`` -> a fault).
        """
        fb = self._subscribe()
        for arm in self.arms:
            serial = fb[arm].frame_serial
            last = self._serial_changed_at.get(arm)
            if last is None or last[0] != serial:
                self._serial_changed_at[arm] = (serial, now)
                self._stale.pop(arm, None)
            elif now - last[1] >= self.config.feedback_timeout:
                if arm not in self._stale:
                    _LOG.error("marvin: arm %s: no feedback for %.2f s", arm, now - last[1])
                self._stale[arm] = now - last[1]
        parts = [fb[arm] for arm in self.arms]
        velocity = None if any(p.velocity is None for p in parts) else np.concatenate([p.velocity for p in parts])
        effort = None if any(p.effort is None for p in parts) else np.concatenate([p.effort for p in parts])
        return JointReading(np.concatenate([p.position for p in parts]), velocity, effort, now)

    def _take_token(self, now: float) -> bool:
        """Refill the bucket up to ``now`` [s] (clock time; a clock not later than the last refill adds nothing)
        and take a token for one send; False (nothing taken) when less than ``1 - RATE_TOLERANCE`` is left."""
        if self._tokens_at is None or now > self._tokens_at:
            if self._tokens_at is not None:
                self._tokens = min(RATE_BURST, self._tokens + (now - self._tokens_at) * self.rate_limit_hz)
            self._tokens_at = now
        if self._tokens < 1.0 - RATE_TOLERANCE:
            return False
        self._tokens -= 1.0
        return True

    def write(self, position: np.ndarray) -> None:
        """Send targets (n,) [rad] as degrees, rate limited by a token bucket on ``clock``.

        The bucket refills at ``rate_limit_hz`` tokens/s up to ``RATE_BURST`` (2); a send takes one token. A
        target that finds none (less than ``1 - RATE_TOLERANCE``) is dropped, not delayed, and counted in
        ``skipped_writes``. So a loop with deadlines ``1 / rate_limit_hz`` apart whose lateness varies by less than
        a period (a late tick, then early ones) sends every target, and over any T seconds at most
        ``RATE_BURST + RATE_TOLERANCE + rate_limit_hz * T`` are sent.
        Refused (logged once, counted in ``refused_writes``) unless enabled and not stopped.

        Raises:
            ValueError: wrong shape or non-finite targets (nothing is sent).
        """
        robot = self._require()
        targets = to_vendor(position, self.sides, self.arm_map)
        if not self._enabled or self._stopped:
            self.refused_writes += 1
            if not self._refusal_logged:
                why = "stopped (soft stop)" if self._stopped else "not enabled"
                _LOG.warning("marvin: arms %s; not sending targets until enable()", why)
                self._refusal_logged = True
            return
        if not self._take_token(self._clock()):
            self.skipped_writes += 1
            return
        robot.clear_set()
        for arm, degrees in targets.items():
            robot.set_joint_cmd_pose(arm, degrees)
        ok = robot.send_cmd()
        self.sent_writes += 1
        if ok == 0:
            self.failed_sends += 1
            if self.failed_sends == 1:
                _LOG.warning("marvin: send_cmd() reported failure (counted in status 'failed_sends')")

    def stop(self) -> None:
        """Soft stop (the vendor's emergency stop) of the used arms; sent again on every call.

        After it, :meth:`write` sends nothing until :meth:`enable`. Never raises.
        """
        self._stopped = True
        if self._robot is None:
            return
        arms = "".join(sorted(self.arms))  # 'A', 'B' or 'AB'
        try:
            self._robot.soft_stop(arms)
        except Exception as exc:  # noqa: BLE001 - never raise from an emergency stop; reported as a fault
            self._stop_failed = f"soft_stop({arms!r}) failed: {type(exc).__name__}: {exc}"
            _LOG.error("marvin: %s", self._stop_failed)
            return
        if self._enabled:
            _LOG.warning("marvin: soft stop of arm(s) %s", arms)
        self._enabled = False

    def disable(self) -> None:
        """Servo off: ``set_state(arm, 0)`` for each used arm, one ``send_cmd()``. Idempotent."""
        if self._robot is None:
            return
        robot = self._robot
        robot.clear_set()
        for arm in self.arms:
            robot.set_state(arm, STATE_IDLE)
        robot.send_cmd()
        if self._enabled:
            _LOG.info("marvin: arms %s idle (servo off)", ",".join(self.arms))
        self._enabled = False

    def close(self) -> None:
        """Disable, then ``release_robot()`` so other programs can connect. Idempotent."""
        robot = getattr(self, "_robot", None)
        if robot is None:
            return
        try:
            self.disable()
        except Exception as exc:  # noqa: BLE001 - close() must still release the controller; the error is logged
            _LOG.error("marvin: disabling the arms on close failed: %s: %s", type(exc).__name__, exc)
        finally:
            self._robot = None
            self._dcss = None
            self._enabled = False
            _release(robot)
            _LOG.info("marvin: released the controller at %s", self.config.ip)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (never raise from a finaliser)
            pass

    # ------------------------------------------------------------------ diagnostics
    def status(self) -> Mapping[str, Any]:
        """Connection, write counters and per arm (``arm_A.*``): state, err_code, servo errors, max temperature [°C].

        Servo error codes come from ``get_servo_error_code(arm)`` at most once
        per ``SERVO_ERROR_PERIOD`` s (the last values are repeated in between).
        """
        out: dict[str, Any] = {
            "ip": self.config.ip,
            "connected": self.connected,
            "enabled": self._enabled,
            "stopped": self._stopped,
            "sent_writes": self.sent_writes,
            "skipped_writes": self.skipped_writes,
            "refused_writes": self.refused_writes,
            "failed_sends": self.failed_sends,
            "effort_field": self.config.effort_field,
        }
        robot = self._robot
        now = self._clock()
        poll = (
            robot is not None
            and hasattr(robot, "get_servo_error_code")
            and (self._servo_polled_at is None or now - self._servo_polled_at >= SERVO_ERROR_PERIOD)
        )
        if poll:
            self._servo_polled_at = now
            for arm in self.arms:
                try:
                    self._servo_errors[arm] = robot.get_servo_error_code(arm)
                except Exception as exc:  # noqa: BLE001 - diagnostics must not fail; the error is the reported value
                    self._servo_errors[arm] = f"{type(exc).__name__}: {exc}"
        for side, arm in zip(self.sides, self.arms, strict=True):
            key = f"arm_{arm}"
            fb = self._feedback.get(arm)
            out[f"{key}.side"] = side
            out[f"{key}.state"] = STATE_NAMES.get(fb.cur_state, str(fb.cur_state)) if fb else None
            out[f"{key}.cur_state"] = fb.cur_state if fb else None
            out[f"{key}.cmd_state"] = fb.cmd_state if fb else None
            out[f"{key}.err_code"] = fb.err_code if fb else None
            out[f"{key}.servo_errors"] = self._servo_errors.get(arm)
            out[f"{key}.max_temperature_c"] = fb.max_temperature if fb else None
            out[f"{key}.frame_serial"] = fb.frame_serial if fb else None
        return out

    def faults(self) -> list[str]:
        """Arms in error (cur_state 100 or err_code != 0), stale feedback, a failed soft stop (as of the last read)."""
        out: list[str] = []
        for side, arm in zip(self.sides, self.arms, strict=True):
            fb = self._feedback.get(arm)
            if fb is not None and _in_error(fb):
                out.append(f"arm {arm} ({side}) in error: cur_state {fb.cur_state}, err_code {fb.err_code}")
            if arm in self._stale:
                out.append(
                    f"arm {arm} ({side}): no feedback for {self._stale[arm]:.2f} s (frame_serial stuck at "
                    f"{self._serial_changed_at[arm][0]}; timeout {self.config.feedback_timeout:g} s)"
                )
        if self._stop_failed:
            out.append(self._stop_failed)
        return out


def _vendor_call(call: Callable[[], _T], failure: str, hint: str = "") -> _T:
    """``call()``; an exception from it becomes HardwareUnavailableError ``"{failure} ({type}: {message}){hint}"``."""
    try:
        return call()
    except Exception as exc:  # the vendor wrapper raises anything: OSError from ctypes, its own errors, ...
        raise HardwareUnavailableError(f"{failure} ({type(exc).__name__}: {exc}){hint}") from exc


def _module_dir(module: ModuleType) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve().parent if file else None


def _release(robot: Any) -> None:
    try:
        robot.release_robot()
    except Exception as exc:  # noqa: BLE001 - releasing is the last step of close(), which must not fail; logged
        _LOG.error("marvin: release_robot() failed: %s: %s", type(exc).__name__, exc)
