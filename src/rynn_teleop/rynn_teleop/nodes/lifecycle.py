"""Managed (lifecycle) nodes: a :class:`~.base.TeleopNode` on rclpy's lifecycle state machine.

:class:`ManagedNode` is ``rclpy.lifecycle.LifecycleNodeMixin`` over ``TeleopNode``: the node keeps its
parameters, loops, meters and diagnostics, and serves the standard lifecycle services (``~/change_state``,
``~/get_state``, ``~/get_available_states``, ``~/get_available_transitions``, ``~/get_transition_graph``) and
publishes ``~/transition_event``, so ``ros2 lifecycle set /arm_driver configure`` and any lifecycle manager
drive it. It starts unconfigured; the states and what each transition means: ``core.lifecycle``.

A subclass implements the transitions as plain methods (:meth:`configure_node`, :meth:`activate_node`, ...)
that raise when they fail, having put back what they changed: the node then stays in the state it was in,
and the error is logged, kept (:attr:`ManagedNode.transition_error`) and shown in diagnostics. Transitions hold
:attr:`~.base.TeleopNode.lock` like every other callback of the node, so a control loop tick never sees half a
transition; ``/diagnostics`` is published at once after each transition.
"""

from __future__ import annotations

from typing import Any

from rclpy.lifecycle import LifecycleNodeMixin, LifecycleState, TransitionCallbackReturn

from ..core.lifecycle import TRANSITIONS, LifecycleError
from .base import TeleopNode, _locked

#: the rclpy lifecycle services, by their attribute on LifecycleNodeMixin
_SERVICES = ("_service_change_state", "_service_get_state", "_service_get_available_states",
             "_service_get_available_transitions", "_service_get_transition_graph")


class ManagedNode(LifecycleNodeMixin, TeleopNode):
    """A TeleopNode that follows the ROS 2 lifecycle; starts unconfigured.

    Attributes:
        transition_error: the exception of the latest transition that failed (None once one succeeds).
    """

    def __init__(self, **node_kwargs: Any) -> None:
        """``node_kwargs`` go to ``rclpy.node.Node`` (see :class:`~.base.TeleopNode`)."""
        self.transition_error: BaseException | None = None
        self._failed_transition = ""  # the transition that raised transition_error
        TeleopNode.__init__(self, **node_kwargs)
        LifecycleNodeMixin.__init__(self)
        change = getattr(self, "_service_change_state", None)
        if change is not None:  # diagnostics at once after a transition asked over the service
            def change_and_report(request, response, serve=change.callback):
                response = serve(request, response)
                self._publish_diagnostics()
                return response

            change.callback = change_and_report
        for name in _SERVICES:  # the node's lock around them, like every callback made through TeleopNode
            service = getattr(self, name, None)
            if service is not None:
                service.callback = _locked(self.lock, service.callback)

    # ------------------------------------------------------------------ what a subclass implements
    def configure_node(self) -> None:
        """unconfigured -> inactive: acquire what the node needs (connect). Raise on failure."""

    def activate_node(self) -> None:
        """inactive -> active: start acting (enable, follow commands). Raise on failure."""

    def deactivate_node(self) -> None:
        """active -> inactive: stop acting (disable). Raise on failure."""

    def cleanup_node(self) -> None:
        """inactive -> unconfigured: release what :meth:`configure_node` acquired. Raise on failure."""

    def shutdown_node(self) -> None:
        """any state -> finalized (also after an error): release everything, never raise."""

    # ------------------------------------------------------------------ state
    @property
    def lifecycle_state(self) -> str:
        """The current state's label: unconfigured, inactive, active, finalized, or a transition state."""
        return self._state_machine.current_state[1]

    @property
    def lifecycle_error(self) -> str:
        """Why the latest failed transition failed, in words ('' when the latest one succeeded)."""
        if self.transition_error is None:
            return ""
        exc = self.transition_error
        return f"{self._failed_transition} failed: {exc}" if str(exc) else f"{self._failed_transition} failed: {exc!r}"

    def change_state(self, transition: str) -> None:
        """Make ``transition`` (configure, activate, deactivate, cleanup, shutdown) in this process, as
        ``~/change_state`` would, and publish diagnostics.

        Raises:
            the node's own error of a failed transition (e.g. HardwareUnavailableError), or LifecycleError.
        """
        if transition != "shutdown" and transition not in TRANSITIONS:
            raise ValueError(f"unknown transition {transition!r}; transitions are {', '.join(TRANSITIONS)}, shutdown")
        with self.lock:
            before = self.lifecycle_state
            result = getattr(self, f"trigger_{transition}")()
            self._publish_diagnostics()
            if result == TransitionCallbackReturn.SUCCESS:
                return
            if self.transition_error is not None and self._failed_transition == transition:
                raise self.transition_error
            raise LifecycleError(self.get_name(), transition, self.lifecycle_state,
                                 f"not possible from {before}")

    # ------------------------------------------------------------------ rclpy's callbacks
    def _run(self, transition: str, method) -> TransitionCallbackReturn:
        with self.lock:
            try:
                method()
            except Exception as exc:  # noqa: BLE001 - the transition fails; the node says why
                self.transition_error, self._failed_transition = exc, transition
                self.get_logger().error(f"{transition} failed: {exc}")
                return TransitionCallbackReturn.FAILURE
            self.transition_error, self._failed_transition = None, ""
            return TransitionCallbackReturn.SUCCESS

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._run("configure", self.configure_node)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._run("activate", self.activate_node)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._run("deactivate", self.deactivate_node)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        return self._run("cleanup", self.cleanup_node)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        with self.lock:
            self.shutdown_node()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """After a transition raised past :meth:`_run` (it does not): release everything, back to unconfigured."""
        with self.lock:
            self.shutdown_node()
        return TransitionCallbackReturn.SUCCESS
