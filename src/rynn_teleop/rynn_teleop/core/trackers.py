"""Latest pose of each worn tracker, freshness, and arm poses relative to the chest.

ROS-free bookkeeping for the tracker node: it feeds every
:class:`~rynn_teleop.sources.trackers.base.TrackerSample` to
:meth:`TrackerSet.update` and asks for the wrist-in-chest and
elbow-in-chest poses with :meth:`TrackerSet.relative`. Times are
caller-supplied [s].
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, NamedTuple

import numpy as np

from ..errors import ConfigurationError
from ..sources.trackers.base import ROLES, SIDES, TrackerSample
from .transforms import invert, is_rigid

RIGID_TOLERANCE = 1e-3  # [-] orthonormality tolerance of an accepted tracker rotation (float32 sources)


class RelativePoses(NamedTuple):
    """One arm's trackers expressed in the chest tracker's frame."""

    wrist: np.ndarray  # (4, 4) wrist tracker in the chest tracker frame [m]
    elbow: np.ndarray | None  # (4, 4) upper-arm (elbow) tracker in the chest tracker frame [m]; None if stale
    stamp: float  # stamp [s] of the wrist sample


class TrackerSet:
    """Newest accepted pose of each role, keyed by the configured serials.

    Counters for diagnostics: :attr:`updates` (accepted samples per role),
    :attr:`rejected` (non-finite, non-rigid or out-of-order samples),
    :attr:`unknown_serials` (samples per unconfigured serial) and
    :attr:`stale_events` (fresh -> stale transitions per role: a role becomes
    fresh when a sample is accepted and a transition is counted once, when
    :meth:`stale` finds it older than the timeout).
    """

    def __init__(self, serials: Mapping[str, str], timeout: float) -> None:
        """
        Args:
            serials: role -> tracker serial for every role in :data:`ROLES`.
            timeout: a role is stale when its newest sample is older than this [s].

        Raises:
            ConfigurationError: a role without a serial, an unknown role, a serial
                used twice, or a timeout that is not > 0.
        """
        unknown = sorted(set(serials) - set(ROLES))
        if unknown:
            raise ConfigurationError(
                f"tracker serials: unknown role(s) {', '.join(unknown)}; roles are {', '.join(ROLES)}"
            )
        missing = [r for r in ROLES if not str(serials.get(r) or "").strip()]
        if missing:
            raise ConfigurationError(f"tracker serials: no serial configured for role(s) {', '.join(missing)}")
        self.serials: dict[str, str] = {r: str(serials[r]).strip() for r in ROLES}
        owners: dict[str, list[str]] = {}
        for role, serial in self.serials.items():
            owners.setdefault(serial, []).append(role)
        shared = {s: rs for s, rs in owners.items() if len(rs) > 1}
        if shared:
            what = "; ".join(f"{s} for {' and '.join(rs)}" for s, rs in sorted(shared.items()))
            raise ConfigurationError(f"tracker serials: a serial is configured for several roles: {what}")
        if not timeout > 0:
            raise ConfigurationError(f"tracker timeout must be > 0 s, got {timeout}")
        self.timeout = float(timeout)  # [s]
        self._role_of = {s: r for r, s in self.serials.items()}
        self._pose: dict[str, np.ndarray] = {}
        self._stamp: dict[str, float] = {r: -np.inf for r in ROLES}
        self._fresh_flag: dict[str, bool] = {r: False for r in ROLES}
        self.updates: Counter[str] = Counter()
        self.rejected = 0
        self.unknown_serials: Counter[str] = Counter()
        self.stale_events: Counter[str] = Counter()

    def role_of(self, serial: str) -> str | None:
        """Role of a configured serial (None if it is not configured)."""
        return self._role_of.get(serial)

    def check_discovered(self, seen: set[str]) -> None:
        """Raise ConfigurationError unless every configured serial is in ``seen``.

        The message names the missing roles and serials, and lists the serials
        actually seen (so a wrong serial in the configuration is easy to spot).
        """
        missing = [(r, s) for r, s in self.serials.items() if s not in seen]
        if not missing:
            return
        what = ", ".join(f"{r} ({s})" for r, s in missing)
        if seen:
            found = f"serials seen: {', '.join(sorted(seen))}"
        else:
            found = "no tracker was seen at all (are they switched on, paired and tracked?)"
        raise ConfigurationError(f"tracker(s) not found: {what}; {found}")

    def update(self, sample: TrackerSample) -> str | None:
        """Store ``sample`` as its role's newest pose; returns the role, or None if not stored.

        Not stored: a serial that is not configured (counted in
        :attr:`unknown_serials`), and a non-finite or non-rigid matrix, a
        non-finite stamp or a stamp older than the stored one (counted in
        :attr:`rejected`).
        """
        role = self._role_of.get(sample.serial)
        if role is None:
            self.unknown_serials[sample.serial] += 1
            return None
        matrix = np.asarray(sample.matrix, dtype=float)
        stamp = float(sample.stamp)
        if not np.isfinite(stamp) or not is_rigid(matrix, RIGID_TOLERANCE) or stamp < self._stamp[role]:
            self.rejected += 1
            return None
        self._pose[role] = matrix.copy()
        self._stamp[role] = stamp
        self._fresh_flag[role] = True
        self.updates[role] += 1
        return role

    def fresh(self, role: str, now: float) -> bool:
        """True if ``role`` was updated within the timeout before ``now`` [s]."""
        return now - self._stamp[role] <= self.timeout

    def stale(self, now: float) -> set[str]:
        """Roles without an update within the timeout before ``now`` [s] (never updated = stale)."""
        out = {r for r in ROLES if not self.fresh(r, now)}
        for role in out:
            if self._fresh_flag[role]:
                self._fresh_flag[role] = False
                self.stale_events[role] += 1
        return out

    def pose(self, role: str) -> np.ndarray | None:
        """Newest (4, 4) world pose of ``role`` (a copy), or None if never updated."""
        T = self._pose.get(role)
        return None if T is None else T.copy()

    def stamp(self, role: str) -> float:
        """Stamp [s] of the newest sample of ``role`` (-inf if never updated)."""
        return self._stamp[role]

    def relative(self, side: str, now: float) -> RelativePoses | None:
        """``side``'s wrist and elbow trackers in the chest tracker frame at ``now`` [s].

        Uses the latest chest pose: T_chest_x = inv(T_world_chest) @ T_world_x.
        Returns None when the chest or that wrist is stale; the elbow is None
        when only it is stale.

        Raises:
            ValueError: ``side`` is not "left" or "right".
        """
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")
        wrist_role, elbow_role = f"{side}_wrist", f"{side}_elbow"
        if not (self.fresh("chest", now) and self.fresh(wrist_role, now)):
            return None
        T_chest_world = invert(self._pose["chest"])
        elbow = T_chest_world @ self._pose[elbow_role] if self.fresh(elbow_role, now) else None
        return RelativePoses(T_chest_world @ self._pose[wrist_role], elbow, self._stamp[wrist_role])
