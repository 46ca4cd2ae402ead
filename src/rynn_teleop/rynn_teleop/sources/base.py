"""The life cycle every polled source shares (trackers, hands, cameras)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

from ..core.node_io import QoS
from ..core.plugins import Backend

Sample = TypeVar("Sample")


class MessageInput(NamedTuple):
    """A topic whose messages a source follows besides its own input (:meth:`PolledSource.message_inputs`): its
    node subscribes with this type and QoS and hands each message to :meth:`PolledSource.feed` before the next
    read (the synthetic sources follow the physical twin's scene; the synthetic operator also the arm commands)."""

    type: str  # "package/msg/Type"
    qos: QoS


class PolledSource(Backend, ABC, Generic[Sample]):
    """A non-blocking supplier of samples, polled by a node's timer.

    Life cycle: construct (cheap, no device or file access) -> :meth:`start`
    -> any number of :meth:`read` -> :meth:`close`. Used as a context manager,
    ``__enter__`` returns the source *without* starting it and ``__exit__``
    closes it. A source is a backend (:class:`~rynn_teleop.core.plugins.Backend`): registered by
    ``name`` with its ``SETTINGS`` in its family's registry.
    """

    name: ClassVar[str]  # the backend name nodes select it by ("synthetic", "replay", a vendor backend)
    #: samples lie on a time grid of the source's own, started by the node on one of its loop ticks
    #: (``TeleopNode.start_grid_on_this_tick``) so that a sample is due just before every tick
    aligns_to_ticks: ClassVar[bool] = False

    @abstractmethod
    def start(self, now: float) -> None:
        """Open the device or file at time ``now`` [s].

        Raises:
            HardwareUnavailableError: the SDK, runtime or device is missing.
            ConfigurationError: the configuration does not fit what was found.
        """

    @abstractmethod
    def read(self, now: float) -> list[Sample]:
        """Every sample produced since the previous call, oldest first (never blocks).

        Raises RuntimeError when called before :meth:`start` or after :meth:`close`.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the device or file; calling it again does nothing."""

    def message_inputs(self) -> Mapping[str, MessageInput]:
        """Topic -> :class:`MessageInput` of the topics this source follows (declared in its ``IO`` too). Default:
        none."""
        return {}

    def feed(self, topic: str, message: Any) -> None:
        """One message of a :meth:`message_inputs` topic (read by attribute: ROS-free)."""
        raise NotImplementedError(f"{type(self).__name__} follows no topic")

    @property
    def finished(self) -> bool:
        """True once a finite source (a replay that does not loop) has returned its last sample; a live or
        looping source never finishes."""
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
