"""Typed errors of rynn_teleop.

Every error the stack raises on purpose derives from :class:`RynnTeleopError`,
so callers (the runner, the CLI, node ``main`` functions) can catch one base
class, print the message and exit non-zero instead of dumping a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

#: the exit code of a process that refuses to start (a bad parameter, missing hardware): launch files do not
#: restart it, since a restart would only repeat the refusal
REFUSED_EXIT_CODE = 2


class RynnTeleopError(Exception):
    """Base class of every error raised deliberately by rynn_teleop."""


class ConfigurationError(RynnTeleopError):
    """A configuration file or value is missing or malformed."""


class ParameterError(ConfigurationError):
    """A node parameter is invalid, or a parameter file has an unknown key.

    Attributes:
        key: the parameter name the message is about.
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class FrameNotFoundError(RynnTeleopError, KeyError):
    """A frame name is not part of the robot description.

    Attributes:
        frame: the name that was asked for.
        known: every frame name the description has.
    """

    def __init__(self, frame: str, known: Iterable[str]) -> None:
        self.frame = frame
        self.known = tuple(known)
        super().__init__(f"unknown frame {frame!r}; known frames: {', '.join(self.known)}")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


class JointNotFoundError(RynnTeleopError, KeyError):
    """A joint name is not one of the robot's actuated joints."""

    def __init__(self, joint: str, known: Iterable[str]) -> None:
        self.joint = joint
        self.known = tuple(known)
        super().__init__(f"unknown joint {joint!r}; known joints: {', '.join(self.known)}")

    def __str__(self) -> str:
        return self.args[0]


class HardwareUnavailableError(RynnTeleopError):
    """A real backend's device, runtime or vendor SDK is missing."""


def run_command(func: Callable[[Any], int], args: Any) -> int:
    """``func(args)``'s exit code, with the command line's error handling: a :class:`RynnTeleopError` is one line on
    standard error and its ``exit_code`` (default :data:`REFUSED_EXIT_CODE`), a file or folder the system refuses
    likewise with :data:`REFUSED_EXIT_CODE`, Ctrl-C 130; never a traceback."""
    import sys

    try:
        return func(args)
    except RynnTeleopError as exc:
        print(f"rynn-teleop: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", REFUSED_EXIT_CODE))  # 1 for data errors (recording.errors)
    except OSError as exc:  # a file or folder the system refuses (missing, permissions, read-only, a folder)
        where = f": {exc.filename}" if exc.filename else ""
        print(f"rynn-teleop: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return REFUSED_EXIT_CODE
    except KeyboardInterrupt:
        return 130

