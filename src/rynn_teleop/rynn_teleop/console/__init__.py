"""The operator console: a local web page (``server``) that the console node (``nodes/console.py``) serves.

ROS-free: the node hands the server the frames, the session state and the operator actions.
"""
