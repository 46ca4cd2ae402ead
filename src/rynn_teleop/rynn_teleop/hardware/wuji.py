"""WUJI dexterous hands through the vendor SDK ``wujihandpy`` (``kind = "wuji"``).

One ``wujihandpy.Hand`` per side (opened by side or by serial number), streamed through its realtime
controller (PDO at 1 kHz; the SDK low-passes the targets at ``filter_cutoff_hz``). ``connect`` opens the
hands and enters the controllers, ``enable`` holds where they are, ``read`` gives 40 positions [rad] and
motor currents [A], ``write`` takes 40 targets [rad], ``close`` disables and leaves the controllers.

Joint order: :func:`~rynn_teleop.core.robot_model.hand_joint_names` per side, sides in the order given;
the SDK's (5, 4) arrays are fingers x joints (thumb first, proximal to distal): :func:`to_sdk` and
:func:`from_sdk` convert. Positions [rad] (zero and sign as the URDF); effort is the motor current [A],
not a torque; no velocity (``None``).

Threads: the realtime calls never block and raise nothing on a disconnect, so a side thread probes
``read_input_voltage()`` (a blocking SDO read) every ``voltage_period_s``; a failing probe marks the hand
disconnected (:meth:`WujiBackend.faults`). SDO calls share one lock per hand and the realtime calls
another, never held across I/O, so the probe never stalls ``read`` or ``write``.
"""

from __future__ import annotations

import importlib
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..core.layout import N_HAND, SIDES
from ..core.params import Param
from ..core.robot_model import hand_joint_names
from ..errors import ConfigurationError, HardwareUnavailableError
from .base import HAND_BACKENDS, DriverContext, JointBackend, JointReading

_log = logging.getLogger(__name__)

N_FINGERS = 5
N_FINGER_JOINTS = 4
SDK_SHAPE = (N_FINGERS, N_FINGER_JOINTS)
USB_ID = "0483:2000"  # vendor:product of the hand
UDEV_HINT = (
    "check that the hand is plugged in and powered (lsusb shows 0483:2000) and that this user may open it: "
    "echo 'SUBSYSTEM==\"usb\", ATTR{idVendor}==\"0483\", MODE=\"0666\"' | "
    "sudo tee /etc/udev/rules.d/95-wujihand.rules && sudo udevadm control --reload-rules && sudo udevadm trigger"
)
PROBE_JOIN_TIMEOUT_S = 2.0  # [s] beyond one period: close() waits this long for a probe in flight (SDK timeout 0.5 s)


# ---------------------------------------------------------------------- layout (pure)
def to_sdk(q20: np.ndarray) -> np.ndarray:
    """One hand's 20 canonical joint values -> the SDK's (5, 4) float64 array.

    ``q20[(f-1)*4 + (j-1)]`` (finger ``f`` = 1 thumb .. 5 pinky, joint ``j`` =
    1 proximal .. 4 distal) lands at ``[f-1, j-1]``. Returns a new C-contiguous array.
    """
    q = np.asarray(q20, dtype=np.float64)
    if q.shape != (N_HAND,):
        raise ConfigurationError(f"a WUJI hand takes {N_HAND} joint values, got shape {q.shape}")
    return np.array(q.reshape(SDK_SHAPE), dtype=np.float64, order="C")


def from_sdk(a54: np.ndarray) -> np.ndarray:
    """The SDK's (5, 4) array (fingers x joints) -> 20 values in canonical order (inverse of :func:`to_sdk`)."""
    a = np.asarray(a54, dtype=np.float64)
    if a.shape != SDK_SHAPE:
        raise ConfigurationError(f"the WUJI SDK array must have shape {SDK_SHAPE}, got {a.shape}")
    return a.reshape(N_HAND).copy()


def _position_limits(names: Sequence[str], limits: tuple[np.ndarray, np.ndarray] | None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) [rad] of the joints ``names``: ``limits`` checked, else the default robot's.

    Raises:
        ConfigurationError: limits of the wrong shape, not finite, or lower above upper.
    """
    if limits is None:
        from ..core.robot_model import RobotModel

        robot = RobotModel.default()
        found = robot.limits[robot.indices(list(names))]
        return np.asarray(found.lower, float), np.asarray(found.upper, float)
    lower, upper = (np.asarray(v, dtype=float) for v in limits)
    n = len(names)
    if lower.shape != (n,) or upper.shape != (n,) or not (np.isfinite(lower).all() and np.isfinite(upper).all()) \
            or (lower > upper).any():
        raise ConfigurationError(f"wuji: position_limits must be two finite (n,) arrays with lower <= upper for the "
                                 f"{n} joints, got shapes {lower.shape} and {upper.shape}")
    return lower, upper


# ---------------------------------------------------------------------- state
class HandHealth(NamedTuple):
    """What the connection probe last found for one hand."""

    connected: bool
    input_voltage: float | None  # [V] last successful probe (None before the first)
    error: str | None  # why the last probe failed (None when connected)


@dataclass
class _Link:
    """One open hand: the SDK objects and what the probe and the reads found."""

    side: str
    label: str  # "left hand" or "left hand (serial ...)": used in messages
    hand: Any
    controller: Any = None  # the entered realtime controller
    exits: ExitStack = field(default_factory=ExitStack)  # leaves the realtime controller
    sdo_lock: threading.Lock = field(default_factory=threading.Lock)  # blocking SDO calls
    connected: bool = True
    error: str | None = None
    input_voltage: float | None = None  # [V]
    effort_supported: bool = True  # False once the SDK refused effort (hand firmware < 1.2.0)
    max_abs_effort: float | None = None  # [A] largest |current| of the last reading


# ---------------------------------------------------------------------- backend
@HAND_BACKENDS.register
class WujiBackend(JointBackend):
    """One or two WUJI hands (20 joints each) through ``wujihandpy``'s realtime controller."""

    name = "wuji"
    SETTINGS = (
        Param("serial_left", str, "", "left hand serial number (empty: open by side)"),
        Param("serial_right", str, "", "right hand serial number (empty: open by side)"),
        Param("filter_cutoff_hz", float, 5.0, "realtime controller low-pass cutoff", "Hz", min=0.1, max=500.0),
    )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: DriverContext) -> WujiBackend:
        """The node's hands, each opened by its serial number when one is given (else by side)."""
        serials = {s: settings[f"serial_{s}"] for s in context.sides if settings[f"serial_{s}"]}
        return cls(sides=context.sides, serial_numbers=serials or None,
                   filter_cutoff_hz=settings["filter_cutoff_hz"],
                   position_limits=(context.limits.lower, context.limits.upper))

    def __init__(
        self,
        sides: Sequence[str] = SIDES,
        serial_numbers: Mapping[str, str] | None = None,
        filter_cutoff_hz: float = 5.0,
        voltage_period_s: float = 1.0,
        sdk: Any = None,
        position_limits: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """
        Args:
            sides: hands driven, in joint order (``"left"``, ``"right"``).
            serial_numbers: side -> USB serial number; a side missing or empty
                is opened by handedness (``Hand(side=...)``).
            filter_cutoff_hz: cutoff of the SDK's low-pass on the targets [Hz]
                (time constant 1 / (2 pi fc): 32 ms at 5 Hz).
            voltage_period_s: period of the connection probe [s].
            sdk: a module-like stand-in for ``wujihandpy`` (tests); default:
                ``import wujihandpy`` in :meth:`connect`.
            position_limits: (lower, upper) position limits [rad] of the driven joints, in joint order. The
                holds this backend sets itself (:meth:`enable`, :meth:`stop`) target the measured position
                kept within them (default: the default robot description's limits of these joints).
        """
        sides = tuple(sides)
        if not sides or len(set(sides)) != len(sides) or any(s not in SIDES for s in sides):
            raise ConfigurationError(f"wuji: sides must be distinct values of {SIDES}, got {sides!r}")
        serials = {k: v for k, v in (serial_numbers or {}).items() if v}
        unknown = sorted(set(serials) - set(sides))
        if unknown:
            raise ConfigurationError(f"wuji: serial numbers given for hands not driven: {unknown} (sides {sides})")
        if any(not isinstance(v, str) for v in serials.values()):
            raise ConfigurationError(f"wuji: serial numbers must be strings, got {serials!r}")
        if not (math.isfinite(filter_cutoff_hz) and filter_cutoff_hz > 0):
            raise ConfigurationError(f"wuji: filter_cutoff_hz must be > 0 Hz, got {filter_cutoff_hz!r}")
        if not (math.isfinite(voltage_period_s) and voltage_period_s > 0):
            raise ConfigurationError(f"wuji: voltage_period_s must be > 0 s, got {voltage_period_s!r}")
        self.sides = sides
        self.serial_numbers: dict[str, str] = serials
        self.filter_cutoff_hz = float(filter_cutoff_hz)
        self.voltage_period_s = float(voltage_period_s)
        self.joint_names = sum((hand_joint_names(s) for s in sides), ())
        self._lower, self._upper = _position_limits(self.joint_names, position_limits)
        self._sdk = sdk
        self._links: dict[str, _Link] = {}
        self._rt_lock = threading.Lock()  # realtime calls and the accepting flag; never held across I/O
        self._accepting = False  # writes are followed only between enable() and stop()/disable()
        self._refused_writes = 0  # writes refused since connect()
        self._refusal_warned = False  # one warning per refusing episode
        self._stop_errors: dict[str, str] = {}
        self._probe_stop = threading.Event()
        self._probe_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ life cycle
    @property
    def connected(self) -> bool:
        """True between :meth:`connect` and :meth:`close` (whatever the probe says)."""
        return bool(self._links)

    @property
    def probing(self) -> bool:
        """True while the connection-probe thread runs."""
        return self._probe_thread is not None and self._probe_thread.is_alive()

    def connect(self) -> None:
        """Open every hand and enter its realtime controller; start the probe thread.

        Raises:
            HardwareUnavailableError: ``wujihandpy`` is not installed, a hand
                cannot be opened (absent, not powered, no USB permission, the
                other side, firmware too old) or its realtime controller fails.
        """
        if self._links:
            return
        sdk = self._load_sdk()
        try:
            for side in self.sides:
                self._links[side] = self._open(sdk, side)
        except BaseException:
            self._release_all(disable=False)
            raise
        self._probe_stop.clear()
        self._probe_thread = threading.Thread(target=self._probe_loop, name="wuji-probe", daemon=True)
        self._probe_thread.start()

    def _load_sdk(self) -> Any:
        if self._sdk is not None:
            return self._sdk
        try:
            self._sdk = importlib.import_module("wujihandpy")
        except (ImportError, OSError) as exc:
            raise HardwareUnavailableError(
                f"wuji: the vendor SDK wujihandpy cannot be imported ({exc}); install it with 'pip install wujihandpy'"
            ) from exc
        return self._sdk

    def _open(self, sdk: Any, side: str) -> _Link:
        serial = self.serial_numbers.get(side)
        label = f"{side} hand (serial {serial})" if serial else f"{side} hand"
        try:
            hand = sdk.Hand(serial_number=serial) if serial else sdk.Hand(side=side)
        except Exception as exc:  # RuntimeError: "Effort feedback requires firmware version >= 1.2.0"
            how = f"serial_number={serial!r}" if serial else f"side={side!r}"
            raise HardwareUnavailableError(
                f"wuji: cannot open the {label} (wujihandpy.Hand({how}), USB {USB_ID}): "
                f"{type(exc).__name__}: {exc}; {UDEV_HINT}"
            ) from exc
        link = _Link(side=side, label=label, hand=hand)
        # The probe thread calls the SDK too: lift the SDK's same-thread check; our locks serialise instead.
        disable_check = getattr(hand, "disable_thread_safe_check", None)
        if disable_check is not None:
            disable_check()
        try:
            with link.sdo_lock:
                link.controller = link.exits.enter_context(
                    hand.realtime_controller(
                        enable_upstream=True, filter=sdk.filter.LowPass(cutoff_freq=self.filter_cutoff_hz)
                    )
                )
        except Exception as exc:
            raise HardwareUnavailableError(
                f"wuji: the {label} opened but its realtime controller did not start: {type(exc).__name__}: {exc}"
            ) from exc
        return link

    def enable(self) -> None:
        """Joints on, holding the measured position (no jump); writes are followed again.

        The hold target is set before enabling (so the joints switch on at it)
        and again after (fingers moved by hand meanwhile stay where they are).

        Raises:
            HardwareUnavailableError: not connected, or a hand refused (the
                others are enabled and holding; writes stay refused).
        """
        links = self._require_links()
        self._hold(links)
        failed = self._write_enabled(links, True)
        with self._rt_lock:
            self._hold_locked(links)
            if not failed:
                self._accepting, self._refusal_warned = True, False
                self._stop_errors.clear()
        if failed:
            raise HardwareUnavailableError("wuji: cannot enable " + "; ".join(failed))

    def read(self, now: float) -> JointReading:
        """Newest positions [rad] and motor currents [A] of every hand (non-blocking); ``stamp = now``.

        ``effort`` is None when no hand reports it (hand firmware < 1.2.0);
        a hand that does not is NaN while another does. ``velocity`` is None
        (the SDK does not give it).
        """
        links = self._require_links()
        positions, efforts = [], []
        with self._rt_lock:
            for link in links:
                positions.append(from_sdk(link.controller.get_joint_actual_position()))
                efforts.append(self._read_effort(link))
        effort = None if all(e is None for e in efforts) else np.concatenate(
            [np.full(N_HAND, np.nan) if e is None else e for e in efforts]
        )
        return JointReading(np.concatenate(positions), None, effort, float(now))

    def _read_effort(self, link: _Link) -> np.ndarray | None:
        if not link.effort_supported:
            return None
        try:
            effort = from_sdk(link.controller.get_joint_actual_effort())
        except ConfigurationError:
            raise
        except Exception as exc:  # noqa: BLE001 - RuntimeError: "Effort feedback requires firmware version >= 1.2.0"
            link.effort_supported = False
            _log.warning("wuji: %s reports no effort (%s); publishing none for it", link.label, exc)
            return None
        link.max_abs_effort = float(np.max(np.abs(effort)))
        return effort

    def write(self, position: np.ndarray) -> None:
        """Send targets (20 per hand, canonical order) [rad] to the realtime controllers (non-blocking).

        Refused (counted in :meth:`status`, warned once) before :meth:`enable`
        and after :meth:`stop` or :meth:`disable`, until the next :meth:`enable`.
        """
        q = np.asarray(position, dtype=np.float64)
        n = len(self.joint_names)
        if q.shape != (n,) or not np.all(np.isfinite(q)):
            raise ConfigurationError(f"wuji: write needs {n} finite positions, got shape {q.shape}")
        links = self._require_links()
        with self._rt_lock:
            if not self._accepting:
                self._refused_writes += 1
                if not self._refusal_warned:
                    self._refusal_warned = True
                    _log.warning("wuji: write refused: the hands are stopped or not enabled (call enable())")
                return
            for k, link in enumerate(links):
                link.controller.set_joint_target_position(to_sdk(q[k * N_HAND:(k + 1) * N_HAND]))

    def stop(self) -> None:
        """Emergency stop: hold the measured position and refuse writes until :meth:`enable`.

        Holding rather than disabling: a disabled hand goes limp and drops
        whatever it holds (and its fingers fall); holding keeps the grasp. The
        SDK's low-pass brings the sent target to the measured position within
        a few time constants (about 0.1 s at 5 Hz). Safe at any time and
        repeatedly; never raises (a failure is logged and listed in :meth:`faults`).
        """
        links = list(self._links.values())
        with self._rt_lock:
            self._accepting = False
            self._refusal_warned = False
            for link in links:
                try:
                    target = self._hold_target(link, from_sdk(link.controller.get_joint_actual_position()))
                    link.controller.set_joint_target_position(to_sdk(target))
                except Exception as exc:  # noqa: BLE001 - an e-stop must reach every hand
                    self._stop_errors[link.side] = f"{type(exc).__name__}: {exc}"
                    _log.error("wuji: stop: cannot hold the %s: %s", link.label, exc)

    def disable(self) -> None:
        """Joints off (limp: a held object drops) and writes refused. Idempotent; no-op when not connected.

        Raises:
            HardwareUnavailableError: a hand did not answer (every hand is tried).
        """
        failed = self._disable(list(self._links.values()))
        if failed:
            raise HardwareUnavailableError("wuji: cannot disable " + "; ".join(failed))

    def _disable(self, links: list[_Link]) -> list[str]:
        with self._rt_lock:
            self._accepting, self._refusal_warned = False, False
        return self._write_enabled(links, False)

    def _write_enabled(self, links: list[_Link], enabled: bool) -> list[str]:
        """Switch every hand's joints on or off; the failures, one line per hand (failed links are marked)."""
        failed = []
        for link in links:
            try:
                with link.sdo_lock:
                    link.hand.write_joint_enabled(enabled)
            except Exception as exc:  # noqa: BLE001 - any SDK error on one hand: report it, try the others
                self._mark(link, exc)
                failed.append(f"{link.label}: {type(exc).__name__}: {exc}")
        return failed

    def close(self) -> None:
        """Stop the probe thread, disable the joints, leave the realtime controllers. Idempotent; never raises.

        The joints are disabled before leaving the realtime controller: leaving
        it switches them back to SDO position mode and re-enables those that
        were on, at a target the backend does not control.
        """
        self._stop_probe()
        if self._links:
            self._release_all(disable=True)

    def _release_all(self, disable: bool) -> None:
        links = list(self._links.values())
        if disable:
            for failure in self._disable(links):
                _log.error("wuji: close: %s", failure)
        for link in links:
            try:
                with link.sdo_lock:
                    link.exits.close()
            except Exception as exc:  # noqa: BLE001 - release the others regardless
                _log.error("wuji: close: leaving the realtime controller of the %s failed: %s", link.label, exc)
        with self._rt_lock:
            self._accepting = False
            self._links = {}

    # ------------------------------------------------------------------ connection probe
    def probe_connection(self) -> dict[str, HandHealth]:
        """Read every hand's input voltage once (blocking SDO); a failure marks that hand disconnected.

        Called every ``voltage_period_s`` by the probe thread; a hand whose
        probe works again is marked connected again. Returns side -> health.
        """
        result = {}
        for link in list(self._links.values()):
            try:
                with link.sdo_lock:
                    voltage = float(link.hand.read_input_voltage())
            except Exception as exc:  # noqa: BLE001 - ConnectionError on unplug, TimeoutError, anything
                self._mark(link, exc)
            else:
                if not link.connected:
                    _log.warning("wuji: %s answers again (%.1f V)", link.label, voltage)
                link.connected, link.error, link.input_voltage = True, None, voltage
            result[link.side] = HandHealth(link.connected, link.input_voltage, link.error)
        return result

    def _mark(self, link: _Link, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if link.connected:
            _log.error("wuji: %s disconnected: %s", link.label, error)
        link.connected, link.error = False, error

    def _probe_loop(self) -> None:
        while not self._probe_stop.wait(self.voltage_period_s):
            try:
                self.probe_connection()
            except Exception:  # noqa: BLE001 - the probe must outlive any surprise
                _log.exception("wuji: connection probe failed")

    def _stop_probe(self) -> None:
        thread, self._probe_thread = self._probe_thread, None
        self._probe_stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.voltage_period_s + PROBE_JOIN_TIMEOUT_S)
            if thread.is_alive():
                _log.error("wuji: the connection probe thread did not stop (an SDK call hangs)")

    # ------------------------------------------------------------------ diagnostics
    def status(self) -> Mapping[str, Any]:
        """Per hand: ``{side}.connected``, ``{side}.input_voltage_v`` [V] (last probe),
        ``{side}.max_abs_effort_a`` [A] (largest |current| of the last read); and the write state."""
        values: dict[str, Any] = {
            "accepting_writes": self._accepting,
            "refused_writes": self._refused_writes,
            "filter_cutoff_hz": self.filter_cutoff_hz,
        }
        for side in self.sides:
            link = self._links.get(side)
            values[f"{side}.connected"] = bool(link and link.connected)
            values[f"{side}.input_voltage_v"] = None if link is None else link.input_voltage
            values[f"{side}.max_abs_effort_a"] = None if link is None else link.max_abs_effort
            if link is not None and not link.effort_supported:
                values[f"{side}.effort"] = "not reported (hand firmware < 1.2.0)"
        return values

    def faults(self) -> list[str]:
        """``"<side> hand disconnected: <error>"`` per hand whose last probe failed; failed stops."""
        out = [f"{link.side} hand disconnected: {link.error}" for link in self._links.values() if not link.connected]
        out += [f"{side} hand stop failed: {err}" for side, err in self._stop_errors.items()]
        return out

    # ------------------------------------------------------------------ helpers
    def _require_links(self) -> list[_Link]:
        if not self._links:
            raise HardwareUnavailableError("wuji: the hands are not connected (call connect() first)")
        return list(self._links.values())

    def _hold(self, links: list[_Link]) -> None:
        with self._rt_lock:
            self._hold_locked(links)

    def _hold_locked(self, links: list[_Link]) -> None:
        for link in links:
            target = self._hold_target(link, from_sdk(link.controller.get_joint_actual_position()))
            link.controller.set_joint_target_position(to_sdk(target))

    def _hold_target(self, link: _Link, measured: np.ndarray) -> np.ndarray:
        """One hand's hold target: its measured position (20,) [rad] kept within the position limits. A joint
        measured outside them (a finger resting past its limit) is held at the limit, with a warning naming it."""
        k = self.sides.index(link.side) * N_HAND
        target = np.minimum(np.maximum(measured, self._lower[k:k + N_HAND]), self._upper[k:k + N_HAND])
        outside = np.nonzero(target != measured)[0]
        if outside.size:
            names = self.joint_names[k:k + N_HAND]
            _log.warning("wuji: %s measured outside its position limits, held at the limit: %s", link.label,
                         ", ".join(f"{names[i]} {measured[i]:+.4f} -> {target[i]:+.4f} rad" for i in outside))
        return target
