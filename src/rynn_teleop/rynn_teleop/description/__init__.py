"""Robot description: the 54-joint URDF generated from the data tables in urdf/."""
