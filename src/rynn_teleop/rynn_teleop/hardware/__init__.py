"""Robot hardware behind one small interface (ROS-free): vendor adapters and their simulation."""
