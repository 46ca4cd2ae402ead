"""Operator input sources (trackers, ...), ROS-free: they hand poses to the nodes."""
