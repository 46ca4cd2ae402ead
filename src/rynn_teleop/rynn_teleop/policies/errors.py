"""Errors of policy runners at run time (ROS-free).

A policy that cannot be used at all (no such folder, a policy for another robot) is refused when its runner is
built, with a :class:`~rynn_teleop.errors.ConfigurationError`; :class:`PolicyError` is what goes wrong later.
"""

from __future__ import annotations

from ..errors import RynnTeleopError


class PolicyError(RynnTeleopError):
    """A policy runner could not give an action: its worker process died, hung (and was killed), or failed
    the request. The message says which, with the worker's last log lines.

    Attributes:
        alive: whether the runner can still be used (a failed request: yes; a dead or hung worker: no).
    """

    def __init__(self, message: str, *, alive: bool = False) -> None:
        super().__init__(message)
        self.alive = alive
