"""The operator console: a local web page (``server``) that the console node (``nodes/console.py``) serves.

ROS-free: the node hands the server the frames, the session state and the operator actions. ``access`` holds
who may use it (Host, Origin, session secret, JSON rules; threat model in ``docs/security.md``), ``audit`` the
log of accepted actions, ``gate`` the same Host/Origin rules in front of a WebSocket server without its own
(the Foxglove node's).
"""
