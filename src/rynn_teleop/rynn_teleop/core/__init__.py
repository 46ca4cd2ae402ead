"""ROS-free core: maths, rules and data shapes. Never imports rclpy or torch."""
