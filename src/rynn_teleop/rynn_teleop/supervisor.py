"""``rynn-teleop run --mode``: the bringup's process groups as child processes, as the launch file runs them.

One interpreter runs one node at a time (its lock): the whole stack in one process shares it between the 200 Hz
control loops, the camera's rendering and the world model, and the loops miss ticks (measured with a stand-in of
the Marvin SDK, ``bench/marvin_stream.py``: ``run --mode real`` in one process, 177 of 200 ticks a second, gaps up
to 33 ms; as separate processes, 200 Hz). So ``run --mode`` starts one ``rynn-teleop run NODES`` child per process
group of the bringup table (:func:`~.bringup.process_groups`: the launch file's processes; the twin and its
drivers share one), each with its nodes' parameters (the mode's backends and every ``-p``) and its own scheduling
class; ``--one-process`` keeps them all in the calling process.

Start order: every group but :data:`LATE_GROUPS` at once; those once the others are up (each child reports when
its nodes are built and its managed nodes brought up, through a pipe: :data:`READY_FD_ENV`). The synthetic
operator holds the calibration posture only for its first seconds, and arm_ik must be running to calibrate on it.

Stopping: Ctrl-C or SIGTERM stops every child (SIGINT, then SIGKILL after :data:`STOP_TIMEOUT_S`); a child that
exits stops the others, and its exit code is the run's (the first non-zero one). A child dies with this process
however this process ends (Linux: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import RynnTeleopError
from .nodes.process import terminate_with_parent

#: the groups started once every other group is up: the operator input (see the module doc)
LATE_GROUPS: tuple[tuple[str, ...], ...] = (("tracker",),)
#: environment variable: the file descriptor a child writes ``ready`` to once its nodes are up
READY_FD_ENV = "RYNN_TELEOP_READY_FD"
READY_TIMEOUT_S = 180.0  # [s] for a child's nodes to come up (a loaded 2-core machine, the world model's imports)
STOP_TIMEOUT_S = 20.0  # [s] for a child to stop after SIGINT (the recorder closes its episode)


def report_ready() -> None:
    """In a child: tell the supervisor its nodes are up (nothing when not started by one)."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), b"ready\n")
        os.close(int(fd))
    except (OSError, ValueError):
        pass  # the supervisor is gone: it stops this process anyway


def child_arguments(group: Sequence[str], overrides: Mapping[str, Mapping[str, Any]], *, lifecycle: str,
                    duration: float | None, config_dir: str | None) -> list[str]:
    """The ``rynn-teleop`` arguments that run ``group`` with its nodes' parameter ``overrides`` (node -> key ->
    value, each given as ``-p NODE.KEY=JSON``)."""
    args = ["run", *group, "--lifecycle", lifecycle]
    if duration is not None:
        args += ["--duration", repr(float(duration))]
    if config_dir is not None:
        args += ["--config-dir", config_dir]
    for node in group:
        for key, value in overrides.get(node, {}).items():
            args += ["-p", f"{node}.{key}={json.dumps(value)}"]
    return args


class _Child:
    def __init__(self, group: tuple[str, ...], args: list[str]) -> None:
        self.group = group
        read, write = os.pipe()
        env = dict(os.environ, **{READY_FD_ENV: str(write)})
        try:
            # a session of its own: a terminal's Ctrl-C reaches this process only, which sends each child one
            # SIGINT (a second one would interrupt its shutdown: the recorder closing an episode)
            self.proc = subprocess.Popen([sys.executable, "-m", "rynn_teleop.cli", *args], env=env,
                                         pass_fds=(write,), preexec_fn=terminate_with_parent, start_new_session=True)
        finally:
            os.close(write)
        self._ready_fd: int | None = read
        self.ready = False

    @property
    def name(self) -> str:
        return "+".join(self.group)

    def poll_ready(self) -> bool:
        """Whether the child said it is up (reads its pipe without blocking)."""
        if self.ready or self._ready_fd is None:
            return self.ready
        if select.select([self._ready_fd], [], [], 0)[0]:
            data = os.read(self._ready_fd, 64)
            self.ready = data.startswith(b"ready")
            os.close(self._ready_fd)
            self._ready_fd = None
        return self.ready

    def close(self) -> None:
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None


def run_groups(groups: Sequence[tuple[str, ...]], overrides: Mapping[str, Mapping[str, Any]], *,
               lifecycle: str = "active", duration: float | None = None, config_dir: str | None = None,
               log=print) -> int:
    """Run ``groups`` as child processes (see the module doc) until they end, Ctrl-C or SIGTERM (raised in the
    calling thread as KeyboardInterrupt); the exit code of the run.

    Raises:
        RynnTeleopError: a child's nodes did not come up within :data:`READY_TIMEOUT_S`.
    """
    early = [g for g in groups if g not in LATE_GROUPS]
    late = [g for g in groups if g in LATE_GROUPS]
    children: list[_Child] = []

    def start(batch: list[tuple[str, ...]]) -> None:
        for group in batch:
            children.append(_Child(group, child_arguments(group, overrides, lifecycle=lifecycle, duration=duration,
                                                          config_dir=config_dir)))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(c.poll_ready() for c in children):
            exited = [c for c in children if c.proc.poll() is not None and not c.ready]
            if exited:
                return
            if time.monotonic() > deadline:
                waiting = [c.name for c in children if not c.ready]
                raise RynnTeleopError(f"run: {', '.join(waiting)} did not come up within {READY_TIMEOUT_S:g} s")
            time.sleep(0.05)

    try:
        log(f"run: {len(groups)} processes: {'; '.join('+'.join(g) for g in groups)}")
        start(early)
        if late and all(c.proc.poll() is None for c in children):
            start(late)
        while True:  # until a child ends (all of them, with --duration)
            codes = [c.proc.poll() for c in children]
            failed = [code for code in codes if code not in (None, 0)]
            if failed:
                ended = [c.name for c, code in zip(children, codes) if code not in (None, 0)]
                log(f"run: {', '.join(ended)} exited with {failed[0]}: stopping the others")
                return failed[0]
            if all(code is not None for code in codes):
                return 0
            if duration is None and any(code == 0 for code in codes):  # ended unasked: the run is over
                return 0
            time.sleep(0.1)
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(children)


def _stop(children: list[_Child]) -> None:
    for child in children:
        if child.proc.poll() is None:
            try:
                child.proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in children:
        try:
            child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
        child.close()
