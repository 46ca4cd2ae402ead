"""Tracker frames, the latest pose of each worn tracker, freshness, and arm poses relative to the chest.

ROS-free bookkeeping on both ends of the ``<topic_prefix>/trackers`` topic:

* the tracker node groups what a source returns into frames (:func:`group_frames`: the samples of one
  capture time), drops frames a late tick collected (:func:`drop_late_frames`, bounded lag), and turns
  each frame into the (5, 4, 4) matrices it publishes as one ``geometry_msgs/PoseArray``
  (:meth:`TrackerSet.update_frame`: rows in :data:`ROLES` order, all-NaN for a role without an accepted
  sample in that frame);
* arm_ik feeds those frames to :class:`ChestRelativeArms`, which keeps a :class:`TrackerSet` keyed by
  role and returns the wrist-in-chest and elbow-in-chest poses of each frame
  (:meth:`TrackerSet.relative`, freshness judged at the frame's own stamp).

Times are caller-supplied [s].
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from ..errors import ConfigurationError
from .layout import ROLES, SIDES
from .transforms import invert, is_rigid, rows_rigid

RIGID_TOLERANCE = 1e-3  # [-] orthonormality tolerance of an accepted tracker rotation (float32 sources)
_ROLE_INDEX = {role: i for i, role in enumerate(ROLES)}


class TrackerSample(NamedTuple):
    """One pose of one tracker, as a tracker source returns it."""

    serial: str  # tracker serial number, e.g. "LHR-1A2B3C4D"
    stamp: float  # capture time [s] on the caller's clock (the ``now`` values given to the source's read)
    matrix: np.ndarray  # (4, 4) pose of the tracker in the source's tracking world frame [m]


class RelativePoses(NamedTuple):
    """One arm's trackers expressed in the chest tracker's frame."""

    wrist: np.ndarray  # (4, 4) wrist tracker in the chest tracker frame [m]
    elbow: np.ndarray | None  # (4, 4) upper-arm (elbow) tracker in the chest tracker frame [m]; None if stale
    stamp: float  # stamp [s] of the wrist sample


class TrackerFrame(NamedTuple):
    """The samples of one capture time (one published PoseArray)."""

    stamp: float  # [s] capture time shared by the samples
    samples: tuple[TrackerSample, ...]


class LateFrames(NamedTuple):
    """Outcome of :func:`drop_late_frames`."""

    kept: list[TrackerFrame]  # frames to publish, oldest first
    dropped: int  # [-] frames left out for being older than the lag bound


def rigid_mask(matrices: np.ndarray, tol: float = RIGID_TOLERANCE) -> np.ndarray:
    """(n,) True where ``matrices`` (n, 4, 4) is a finite rigid transform (orthonormal rotation with
    det +1 and bottom row (0, 0, 0, 1), each within ``tol``): :func:`~.transforms.is_rigid` for a batch."""
    m = np.asarray(matrices, dtype=float).reshape(-1, 4, 4)
    return np.array([rows_rigid(rows, tol) for rows in m.tolist()], dtype=bool)


_NAN_MATRIX = ((math.nan,) * 4,) * 4


def frame_matrices(positions: np.ndarray, quaternions: np.ndarray) -> np.ndarray:
    """(n, 4, 4) transforms of ``positions`` (n, 3) [m] and ``quaternions`` (n, 4) (x, y, z, w; normalised
    here); a row whose values are not finite or whose quaternion is zero is all-NaN (no sample).

    Finite rows are rigid by construction (a normalised quaternion's rotation matrix)."""
    p = np.asarray(positions, dtype=float).reshape(-1, 3)
    q = np.asarray(quaternions, dtype=float).reshape(-1, 4)
    if len(p) != len(q):
        raise ValueError(f"{len(p)} positions but {len(q)} quaternions")
    rows = []
    for (px, py, pz), (x, y, z, w) in zip(p.tolist(), q.tolist()):  # floats: a few poses per frame
        n = math.sqrt(x * x + y * y + z * z + w * w)
        if not (n >= 1e-9 and math.isfinite(n + px + py + pz)):
            rows.append(_NAN_MATRIX)
            continue
        x, y, z, w = x / n, y / n, z / n, w / n
        rows.append(((1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w), px),
                     (2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w), py),
                     (2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y), pz),
                     (0.0, 0.0, 0.0, 1.0)))
    return np.array(rows, dtype=float).reshape(-1, 4, 4)


def _quaternion(m: list) -> tuple[float, float, float, float]:
    """Unit quaternion (x, y, z, w), w >= 0, of the rotation part of a rigid (4, 4) transform given as nested
    float lists: Eigen's matrix -> quaternion conversion (Shepperd's method), then normalised."""
    (m00, m01, m02, _), (m10, m11, m12, _), (m20, m21, m22, _) = m[0], m[1], m[2]
    trace = m00 + m11 + m22
    if trace > 0.0:
        t = math.sqrt(trace + 1.0)
        w = 0.5 * t
        t = 0.5 / t
        x, y, z = (m21 - m12) * t, (m02 - m20) * t, (m10 - m01) * t
    else:
        diag = (m00, m11, m22)
        i = 0
        if m11 > m00:
            i = 1
        if m22 > diag[i]:
            i = 2
        j, k = (i + 1) % 3, (i + 2) % 3
        t = math.sqrt(diag[i] - diag[j] - diag[k] + 1.0)
        c = [0.0, 0.0, 0.0]
        c[i] = 0.5 * t
        t = 0.5 / t
        w = (m[k][j] - m[j][k]) * t
        c[j] = (m[j][i] + m[i][j]) * t
        c[k] = (m[k][i] + m[i][k]) * t
        x, y, z = c
    n = math.sqrt(x * x + y * y + z * z + w * w)  # a rotation within the rigid tolerance
    x, y, z, w = x / n, y / n, z / n, w / n
    return (-x, -y, -z, -w) if w < 0 else (x, y, z, w)


def frame_poses(matrices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`frame_matrices`: (n, 4, 4) rigid transforms -> positions (n, 3) [m] and unit
    quaternions (n, 4) (x, y, z, w, with w >= 0); a row with a non-finite value gives all-NaN rows."""
    m = np.asarray(matrices, dtype=float).reshape(-1, 4, 4)
    positions, quats = [], []
    for rows in m.tolist():
        if math.isfinite(sum(sum(r) for r in rows)):
            positions.append((rows[0][3], rows[1][3], rows[2][3]))
            quats.append(_quaternion(rows))
        else:
            positions.append(_NAN_MATRIX[0][:3])
            quats.append(_NAN_MATRIX[0])
    return np.array(positions, dtype=float).reshape(-1, 3), np.array(quats, dtype=float).reshape(-1, 4)


def group_frames(samples: Sequence[TrackerSample]) -> list[TrackerFrame]:
    """Consecutive samples with the same stamp -> one frame each, in input order (sources return samples
    oldest first and every tracker of one capture with the same stamp)."""
    frames: list[TrackerFrame] = []
    run: list[TrackerSample] = []
    for sample in samples:
        if run and sample.stamp != run[0].stamp:
            frames.append(TrackerFrame(run[0].stamp, tuple(run)))
            run = []
        run.append(sample)
    if run:
        frames.append(TrackerFrame(run[0].stamp, tuple(run)))
    return frames


def drop_late_frames(frames: Sequence[TrackerFrame], now: float, max_lag: float) -> LateFrames:
    """The frames to publish at ``now`` [s]: those at most ``max_lag`` [s] old, and always the newest one.

    A tick that ran late finds a backlog of frames (sources produce samples by time); publishing all of it
    would make the lag of the stream unbounded. The newest frame (largest stamp) is never dropped, so a
    stalled source still delivers what it has.
    """
    if not frames:
        return LateFrames([], 0)
    newest = max(range(len(frames)), key=lambda i: frames[i].stamp)
    kept = [f for i, f in enumerate(frames) if i == newest or now - f.stamp <= max_lag]
    return LateFrames(kept, len(frames) - len(kept))


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
        matrix = np.asarray(sample.matrix, dtype=float)
        return self._store(sample.serial, float(sample.stamp), matrix, is_rigid(matrix, RIGID_TOLERANCE))

    def _store(self, serial: str, stamp: float, matrix: np.ndarray, rigid: bool) -> str | None:
        """:meth:`update` once the rigidity of ``matrix`` is known."""
        role = self._role_of.get(serial)
        if role is None:
            self.unknown_serials[serial] += 1
            return None
        if not rigid or not np.isfinite(stamp) or stamp < self._stamp[role]:
            self.rejected += 1
            return None
        self._pose[role] = matrix.copy()
        self._stamp[role] = stamp
        self._fresh_flag[role] = True
        self.updates[role] += 1
        return role

    def update_frame(self, frame: TrackerFrame) -> np.ndarray:
        """:meth:`update` with every sample of ``frame``; returns its (5, 4, 4) matrices in :data:`ROLES`
        order, all-NaN for a role without a sample stored from this frame (absent, unknown or rejected)."""
        out = np.full((len(ROLES), 4, 4), np.nan)
        samples = frame.samples
        matrices = [np.asarray(s.matrix, dtype=float) for s in samples]
        if all(m.shape == (4, 4) for m in matrices):  # one batched rigidity check for the frame
            rigid = rigid_mask(np.stack(matrices)).tolist() if matrices else []
        else:
            rigid = [is_rigid(m, RIGID_TOLERANCE) for m in matrices]
        for sample, matrix, ok in zip(samples, matrices, rigid):
            role = self._store(sample.serial, float(sample.stamp), matrix, ok)
            if role is not None:
                out[_ROLE_INDEX[role]] = self._pose[role]
        return out

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


class ChestRelativeArms:
    """Wrist-in-chest and elbow-in-chest poses from tracker frames (the consumer side of the
    ``<topic_prefix>/trackers`` PoseArray contract).

    Each frame's finite matrices update a :class:`TrackerSet` keyed by role; then each side with a wrist
    pose newer than the last one returned gets its chest-relative poses, judged fresh at the frame's own
    stamp (a frame that waited in a queue is as fresh as when it was captured). Counters: :attr:`frames`,
    :attr:`malformed` (frames without exactly one matrix per role or with a non-finite stamp) and the
    tracker set's ``rejected`` (non-rigid or out-of-order poses).
    """

    def __init__(self, timeout: float) -> None:
        """
        Args:
            timeout: a tracker older than this [s] at a frame's stamp is stale there (no relative pose for
                a stale chest or wrist; no elbow for a stale elbow).
        """
        self.trackers = TrackerSet({r: r for r in ROLES}, timeout)
        self._last_wrist = {s: float("nan") for s in SIDES}
        self.frames = 0  # [-] frames accepted
        self.malformed = 0  # [-] frames refused as a whole

    def update(self, stamp: float, matrices: np.ndarray) -> list[tuple[str, RelativePoses]]:
        """Take one frame: ``matrices`` (5, 4, 4) in :data:`ROLES` order (a row with a non-finite value:
        no sample of that role), captured at ``stamp`` [s]. Returns (side, poses) for every side whose wrist
        is newer than the last one returned and whose chest and wrist are fresh at ``stamp``."""
        matrices = np.asarray(matrices, dtype=float)
        if matrices.shape != (len(ROLES), 4, 4) or not np.isfinite(stamp):
            self.malformed += 1
            return []
        self.frames += 1
        stamp = float(stamp)
        for i, (role, rows) in enumerate(zip(ROLES, matrices.tolist())):
            if math.isfinite(sum(sum(r) for r in rows)):
                self.trackers._store(role, stamp, matrices[i], rows_rigid(rows, RIGID_TOLERANCE))
        out = []
        for side in SIDES:
            rel = self.trackers.relative(side, stamp)
            if rel is not None and rel.stamp != self._last_wrist[side]:
                self._last_wrist[side] = rel.stamp
                out.append((side, rel))
        return out
