"""What every rynn_teleop node shares: schema-declared parameters, diagnostics, ``main``.

A node subclasses :class:`TeleopNode`, sets ``SCHEMA`` (its parameters, see
``core.params``) and builds its core objects from ``self.params``. It is
started either by its console script (``ros2 run rynn_teleop <name>``, see
:func:`run_single`) or together with other nodes by ``rynn_teleop.runner``.
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar, Mapping

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node

from ..core.params import ParamSchema
from ..core.stats import RateMeter
from ..errors import RynnTeleopError
from .parameters import declare_schema


class TeleopNode(Node):
    """Base node: declares ``SCHEMA``, publishes ``/diagnostics`` at 1 Hz."""

    SCHEMA: ClassVar[ParamSchema]

    def __init__(self, **node_kwargs: Any) -> None:
        """``node_kwargs`` go to ``rclpy.node.Node`` (context, parameter_overrides, namespace...)."""
        super().__init__(self.SCHEMA.node_name, **node_kwargs)
        self.params: dict[str, Any] = declare_schema(self, self.SCHEMA)
        self.meters: dict[str, RateMeter] = {}
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._diag_timer = self.create_timer(1.0, self._publish_diagnostics)

    def now_s(self) -> float:
        """The node clock [s]."""
        return self.get_clock().now().nanoseconds * 1e-9

    def meter(self, name: str) -> RateMeter:
        """A named rate/latency meter reported in diagnostics and by the demo."""
        return self.meters.setdefault(name, RateMeter())

    def diagnostic_values(self) -> Mapping[str, Any]:
        """Extra key/values for this node's diagnostics (override to add)."""
        return {}

    def diagnostic_level(self) -> tuple[int, str]:
        """(level, message) of this node's status (override for warnings)."""
        return DiagnosticStatus.OK, "running"

    def _publish_diagnostics(self) -> None:
        now = self.now_s()
        values = {}
        for name, m in self.meters.items():
            values[f"{name}.rate_hz"] = f"{m.rate(now):.1f}"
            p50, p99 = m.latency_percentiles(50, 99)
            if p50 == p50:  # not NaN
                values[f"{name}.latency_p50_ms"] = f"{1e3 * p50:.2f}"
                values[f"{name}.latency_p99_ms"] = f"{1e3 * p99:.2f}"
        values.update({k: str(v) for k, v in self.diagnostic_values().items()})
        level, message = self.diagnostic_level()
        status = DiagnosticStatus(
            level=level,
            name=f"{self.get_name()}",
            message=message,
            hardware_id="",
            values=[KeyValue(key=k, value=v) for k, v in values.items()],
        )
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)


def run_single(node_cls: type[TeleopNode], args: list[str] | None = None) -> int:
    """Console-script entry: init rclpy, spin one node until Ctrl-C; exit code.

    A :class:`RynnTeleopError` at start (bad parameter, missing hardware) is
    printed as one line on stderr and returns 2: the node refuses to start.
    """
    from ..runner import use_transport_profile  # noqa: PLC0415

    use_transport_profile()
    rclpy.init(args=args if args is not None else sys.argv)
    node = None
    code = 0
    try:
        node = node_cls()
        rclpy.spin(node)
    except RynnTeleopError as exc:
        print(f"[{node_cls.SCHEMA.node_name}] refusing to start: {exc}", file=sys.stderr)
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:  # noqa: BLE001
        if rclpy.ok():  # a real error; after a shutdown (launch's Shutdown action) a racing publish is not one
            raise
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return code
