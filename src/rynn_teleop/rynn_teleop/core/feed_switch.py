"""Which camera stream the consumers see: physical or generated (ROS-free rules of ``camera_switch``).

The operator chooses (``preferred``); what is shown (``active``) follows the
choice, except with ``fallback``: while the chosen source is silent (no frame
for ``silent_timeout``) and the other one delivers, the other is shown, and the
chosen one returns once it has delivered again for a timeout. No automatic
change happens within one timeout of any switch (a freshly chosen source gets
time to deliver). A frame is forwarded only if its source is active when it
arrives.
"""

from __future__ import annotations

import math

from ..errors import ConfigurationError

SOURCES = ("physical", "generated")


class FeedSwitch:
    """The selection state; times [s] are the caller's clock."""

    def __init__(self, active: str, silent_timeout: float, fallback: bool = False) -> None:
        if active not in SOURCES:
            raise ConfigurationError(f"source must be one of {SOURCES}, got {active!r}")
        if not silent_timeout > 0:
            raise ConfigurationError(f"silent timeout must be positive, got {silent_timeout}")
        self.preferred = self.active = active
        self.silent_timeout = silent_timeout
        self.fallback = fallback
        self.fallen_back = False
        self.switches = 0
        self.last_switch_time = -math.inf
        self.last_frame = {s: -math.inf for s in SOURCES}
        self._alive_since: dict[str, float | None] = {s: None for s in SOURCES}

    @staticmethod
    def other(source: str) -> str:
        return "generated" if source == "physical" else "physical"

    def select(self, source: str, now: float) -> bool:
        """The operator's choice; True if what is shown changed."""
        if source not in SOURCES:
            raise ConfigurationError(f"source must be one of {SOURCES}, got {source!r}")
        self.preferred = source
        self.fallen_back = False
        return self._activate(source, now)

    def _activate(self, source: str, now: float) -> bool:
        if source == self.active:
            return False
        self.active = source
        self.switches += 1
        self.last_switch_time = now
        return True

    def frame(self, source: str, now: float) -> bool:
        """A colour frame of ``source`` arrived at ``now``; True if it is to be forwarded."""
        if self._alive_since[source] is None or now - self.last_frame[source] > self.silent_timeout:
            self._alive_since[source] = now
        self.last_frame[source] = now
        return source == self.active

    def silent(self, source: str, now: float) -> bool:
        return now - self.last_frame[source] > self.silent_timeout

    def watch(self, now: float) -> str | None:
        """Apply the fallback rule; returns why the shown source changed, or None."""
        if not self.fallback or now - self.last_switch_time < self.silent_timeout:
            return None
        preferred, other = self.preferred, self.other(self.preferred)
        if not self.fallen_back and self.silent(preferred, now) and not self.silent(other, now):
            self.fallen_back = True
            self._activate(other, now)
            return f"fallback: {preferred} silent"
        alive_for = now - self._alive_since[preferred] if self._alive_since[preferred] is not None else 0.0
        if self.fallen_back and not self.silent(preferred, now) and alive_for >= self.silent_timeout:
            self.fallen_back = False
            self._activate(preferred, now)
            return f"{preferred} is back"
        return None
