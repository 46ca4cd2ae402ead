"""Which action each generated frame shows, and which stamp it carries (ROS-free).

:class:`ActionStream` merges partial joint commands (arm commands carry 14 joints, hand commands one hand's 20)
into the 54-D action; stamps are integer nanoseconds. A message older than the last one of its group is
rejected (counted), so the action never moves backwards; a frame is due only when the newest stamp has strictly
increased since the last action taken, so no two frames share a stamp; commands overwritten before any frame
used them are counted as dropped.

:class:`FrameQueue` ties the frames a backend returns to the stamps of the actions they were conditioned on.
Frames leave its queue one per tick, so the output rate stays fixed. When the commands stop while a block is
half full, the last action is repeated as padding (its frames are discarded) until the block completes, so the
last real action is always shown.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from .generator import Generator


class ActionStream:
    """The newest 54-D action merged from partial joint commands (see the module doc)."""

    def __init__(self, joint_names: Sequence[str], groups: Mapping[str, Sequence[str]], initial: np.ndarray) -> None:
        """
        Args:
            joint_names: the action's joint order (54 names).
            groups: group name -> its joint names (e.g. left_arm, right_arm, left_hand, right_hand); a message
                touches the groups of the joints it names.
            initial: (54,) positions [rad] until a joint is first commanded.
        """
        self._index = {n: i for i, n in enumerate(joint_names)}
        self._group_of = {n: g for g, names in groups.items() for n in names}
        self.groups = tuple(groups)
        self.position = np.array(initial, dtype=float)
        self._commanded = np.zeros(len(joint_names), dtype=bool)
        self._group_stamp = {g: -1 for g in groups}  # [ns] newest accepted per group
        self._unused = {g: False for g in groups}  # accepted but not yet taken
        self._taken_stamp = -1  # [ns] stamp of the last action taken
        self._latest = -1  # [ns] newest accepted stamp
        self.dropped = 0  # messages whose joints were all overwritten before a frame used them
        self.out_of_order = 0  # older than their group's newest: rejected
        self.rejected = 0  # malformed or without a known joint

    def update(self, names: Sequence[str], positions: Sequence[float], stamp_ns: int) -> bool:
        """Merge one command; False (counted) if it is malformed, names no known joint, or is out of order."""
        pos = np.asarray(positions, dtype=float)
        known = [(self._index[n], v, self._group_of.get(n)) for n, v in zip(names, pos) if n in self._index]
        if pos.shape != (len(names),) or not np.all(np.isfinite(pos)) or not known:
            self.rejected += 1
            return False
        touched = {g for _, _, g in known if g is not None}
        if any(stamp_ns <= self._group_stamp[g] for g in touched):
            self.out_of_order += 1
            return False
        if touched and all(self._unused[g] for g in touched):
            self.dropped += 1  # the previous command of these joints was never shown
        for g in touched:
            self._group_stamp[g] = stamp_ns
            self._unused[g] = True
        idx = [i for i, _, _ in known]
        self.position[idx] = [v for _, v, _ in known]
        self._commanded[idx] = True
        self._latest = max(self._latest, stamp_ns)
        return True

    def note_superseded(self, n: int) -> None:
        """``n`` commands were replaced by a newer one of the same joints before they were merged (a reader
        that merges only the newest of a batch): counted as dropped, as :meth:`update` would have."""
        self.dropped += int(n)

    @property
    def complete(self) -> bool:
        """Every joint has been commanded at least once."""
        return bool(self._commanded.all())

    def missing_groups(self) -> list[str]:
        """Groups with a joint never commanded."""
        missing = {self._group_of[n] for n, i in self._index.items() if not self._commanded[i] and n in self._group_of}
        return [g for g in self.groups if g in missing]

    @property
    def latest_stamp(self) -> int:
        """Newest accepted stamp [ns] (-1 if none)."""
        return self._latest

    def take(self) -> tuple[np.ndarray, int] | None:
        """The action and its stamp [ns] if a newer command arrived since the last take (and every joint is known)."""
        if not self.complete or self.latest_stamp <= self._taken_stamp:
            return None
        self._taken_stamp = self.latest_stamp
        for g in self._unused:
            self._unused[g] = False
        return self.position.copy(), self._taken_stamp

    def skip_pending(self) -> None:
        """Forget what arrived so far without counting it as dropped (e.g. before the stream starts)."""
        if self.complete:
            self._taken_stamp = self.latest_stamp
        for g in self._unused:
            self._unused[g] = False


class FrameQueue:
    """Steps a :class:`Generator` and releases its frames one per tick with their actions' stamps."""

    def __init__(self, generator: Generator, max_frames: int = 64) -> None:
        self.generator = generator
        self._stamps: deque[int | None] = deque()  # per pending action: its stamp, None for padding
        self._ready: deque[tuple[np.ndarray, int]] = deque()
        self._last_action: np.ndarray | None = None
        self.max_frames = max_frames
        self.discarded = 0  # frames dropped because the output queue was full (generation faster than ticks)
        self.resyncs = 0  # backend and queue disagreed on pending actions (after an error): queue cleared

    def reset(self, reference: np.ndarray) -> None:
        self.generator.reset(reference)
        self._stamps.clear()
        self._ready.clear()
        self._last_action = None

    def push(self, action: np.ndarray, stamp_ns: int | None, condition: np.ndarray | None) -> None:
        """Step the generator with one action (``stamp_ns`` None: padding, its frame is not shown).

        If the step raises, the action is forgotten (no stamp is left behind) and the error propagates.
        """
        self._stamps.append(stamp_ns)
        try:
            frames = self.generator.step(action, condition)
        except Exception:
            self._stamps.pop()
            raise
        if stamp_ns is not None:
            self._last_action = (action, condition)
        for frame in frames:
            stamp = self._stamps.popleft() if self._stamps else None
            if stamp is not None:
                self._ready.append((frame, stamp))
        while len(self._ready) > self.max_frames:
            self._ready.popleft()
            self.discarded += 1
        if len(self._stamps) != self.generator.pending:  # never expected: keep later frames on their own stamps
            self.resyncs += 1
            while len(self._stamps) > self.generator.pending:
                self._stamps.popleft()

    def pad(self) -> None:
        """Complete a half-full block by repeating the last real action (its extra frames are not shown)."""
        if self.generator.pending and self._last_action is not None and any(s is not None for s in self._stamps):
            action, condition = self._last_action
            self.push(action, None, condition)

    def pop(self) -> tuple[np.ndarray, int] | None:
        """The next frame to publish and its stamp [ns], oldest first."""
        return self._ready.popleft() if self._ready else None

    @property
    def waiting(self) -> int:
        """Actions whose frames are not published yet (pending in the backend or queued here)."""
        return sum(s is not None for s in list(self._stamps)) + len(self._ready)  # list(): read from other threads
