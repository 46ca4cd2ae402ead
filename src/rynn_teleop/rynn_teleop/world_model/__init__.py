"""The world model: generated head-camera frames conditioned on the robot's 54-D action.

``generator`` (the backend interface, ROS- and torch-free), ``conditioning``
(FK -> projected keypoints -> depth-aware skeleton images; numpy/OpenCV),
``render`` (the embedded default backend: the robot drawn over the reference
frame) and ``diffusion`` (the learned model in PyTorch; the only subpackage
that imports torch, and only when that backend is built). Backends register in
``generator.WORLD_MODEL_BACKENDS``; the world_model node's ``backend`` parameter
chooses one.
"""
