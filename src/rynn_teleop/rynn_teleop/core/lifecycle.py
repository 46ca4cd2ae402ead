"""The ROS 2 managed-node lifecycle as the drivers follow it, and how a manager brings nodes up in order (ROS-free).

The arm and hand drivers are managed nodes (``nodes.lifecycle.ManagedNode`` on rclpy's lifecycle state
machine, so ``ros2 lifecycle set /arm_driver configure`` works), as ros2_control hardware and nav2 servers are.
Each transition maps onto the backend (``hardware.base.JointBackend``):

============  ==========================  ===========================================================
transition    states                      the driver
============  ==========================  ===========================================================
configure     unconfigured -> inactive    ``connect()``; a failure stays unconfigured, the error named
activate      inactive -> active          ``enable()`` (not while the e-stop is latched: ``~/reset`` does)
deactivate    active -> inactive          ``stop()``, ``disable()``: nothing is commanded any more
cleanup       inactive -> unconfigured    ``close()``
shutdown      any -> finalized            ``stop()``, ``close()``
============  ==========================  ===========================================================

In each primary state: **unconfigured**, nothing is connected and ``/joint_states`` is silent; **inactive**,
the measurement is read and published but nothing is written (ros2_control's inactive hardware) and commands
are dropped (counted); **active**, commands are followed through the safety layer. The e-stop latches in every
state and stays latched across transitions; ``~/reset`` releases it only when active.

A manager (:func:`bring_to`; the runner in-process, ``lifecycle_manager`` over the lifecycle services) brings
nodes to a goal state the way nav2's lifecycle manager does: every node is configured, in order, before any is
activated, so no servo is switched on until every device has answered. Going down is the reverse order. When a
transition fails, what this call already did is undone (reverse order) and the error is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from ..errors import RynnTeleopError

_log = logging.getLogger(__name__)

UNCONFIGURED, INACTIVE, ACTIVE, FINALIZED = "unconfigured", "inactive", "active", "finalized"
#: the states a manager brings nodes to, lowest first
GOALS = (UNCONFIGURED, INACTIVE, ACTIVE)
#: transition -> (the state it starts from, the state it ends in when it succeeds)
TRANSITIONS: dict[str, tuple[str, str]] = {
    "configure": (UNCONFIGURED, INACTIVE),
    "activate": (INACTIVE, ACTIVE),
    "deactivate": (ACTIVE, INACTIVE),
    "cleanup": (INACTIVE, UNCONFIGURED),
}
#: the transition that undoes each one
UNDO = {"configure": "cleanup", "activate": "deactivate", "deactivate": "activate", "cleanup": "configure"}
_UP = {UNCONFIGURED: "configure", INACTIVE: "activate"}  # from a state, one up
_DOWN = {ACTIVE: "deactivate", INACTIVE: "cleanup"}  # from a state, one down


class LifecycleError(RynnTeleopError):
    """A managed node did not make a transition (or cannot be brought to the goal from where it is).

    Attributes:
        node: the node.
        transition: the transition asked ('' when none could be asked).
        state: the node's state afterwards ('' when unknown).
        reason: why, in words (the node's own error where it told one).
    """

    def __init__(self, node: str, transition: str, state: str, reason: str) -> None:
        self.node, self.transition, self.state, self.reason = node, transition, state, reason
        if transition:
            super().__init__(f"{node}: {transition} failed{f' (now {state})' if state else ''}: {reason}")
        else:  # nothing was asked: the reason says what is wrong
            super().__init__(f"{node}: {reason}")


class Step(NamedTuple):
    """One transition of one node."""

    node: str
    transition: str


class Transitioner(Protocol):
    """How a manager reaches the nodes: in-process (the runner) or over the lifecycle services."""

    def state(self, node: str) -> str:
        """The node's current state label (``unconfigured``, ``inactive``, ``active``, ``finalized``, or a
        transition state such as ``configuring``)."""

    def change(self, node: str, transition: str) -> None:
        """Make ``transition``; raise (LifecycleError, or the node's own error) when it fails."""


def plan(states: Mapping[str, str], order: Sequence[str], goal: str) -> list[Step]:
    """The transitions that bring the nodes of ``order`` from ``states`` to ``goal``.

    Up: each transition for every node that needs it, in ``order`` (all configured before any is activated).
    Down: the same in reverse order (all deactivated before any is cleaned up).

    Raises:
        ValueError: ``goal`` is not one of :data:`GOALS`, or a node of ``order`` has no state.
        LifecycleError: a node is finalized or in a transition state.
    """
    if goal not in GOALS:
        raise ValueError(f"unknown lifecycle goal {goal!r}; goals are {', '.join(GOALS)}")
    level = {state: i for i, state in enumerate(GOALS)}
    for node in order:
        if node not in states:
            raise ValueError(f"no state given for {node!r}")
        state = states[node]
        if state == FINALIZED:
            raise LifecycleError(node, "", state, "finalized (shut down): start the node again")
        if state not in level:
            raise LifecycleError(node, "", state, f"in the middle of a transition ({state}); try again")
    target = level[goal]
    steps: list[Step] = []
    for rung in range(target):  # up: unconfigured -> inactive, then inactive -> active
        steps += [Step(n, _UP[GOALS[rung]]) for n in order if level[states[n]] <= rung]
    for rung in range(len(GOALS) - 1, target, -1):  # down: active -> inactive, then inactive -> unconfigured
        steps += [Step(n, _DOWN[GOALS[rung]]) for n in reversed(order) if level[states[n]] >= rung]
    return steps


def bring_to(goal: str, order: Sequence[str], nodes: Transitioner) -> list[Step]:
    """Bring the nodes of ``order`` to ``goal`` (:func:`plan`), one transition at a time; the steps made.

    When a transition fails, the steps already made are undone in reverse order (an undo that fails is logged),
    then its error is raised: the nodes are left as they were found.
    """
    steps = plan({n: nodes.state(n) for n in order}, order, goal)
    done: list[Step] = []
    for step in steps:
        try:
            nodes.change(step.node, step.transition)
        except Exception:
            for undo in reversed(done):
                try:
                    nodes.change(undo.node, UNDO[undo.transition])
                except Exception as exc:  # noqa: BLE001 - the first error is the one raised; this one is logged
                    _log.error("undoing %s of %s failed: %s", undo.transition, undo.node, exc)
            raise
        done.append(step)
    return done
