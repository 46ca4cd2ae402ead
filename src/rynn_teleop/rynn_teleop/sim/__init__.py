"""The physical twin: a MuJoCo simulation of the robot and its task scene (ROS-free).

Layer: above :mod:`rynn_teleop.core`, below the hardware backends and camera sources that build on it; the only
package that imports ``mujoco`` (``tests/test_layers.py``). One concept per module:

* :mod:`.scene`: task scenes declared in ``config/sim/*.yaml`` (table, objects, targets, seeded layouts);
* :mod:`.model`: the MJCF, generated from the project's robot description (``rynn-teleop urdf``) with MjSpec;
* :mod:`.physics`: :class:`~.physics.PhysicsWorld`, one stepped world for both arms, both hands and the scene;
* :mod:`.tasks`: success predicates computed from the physics state;
* :mod:`.operator_plan`: a scripted operator (wrist poses and finger closure over time) per task;
* :mod:`.rollout`: that plan driven straight into the twin (IK, closure), judged by the task;
* :mod:`.cli`: ``rynn-teleop sim export-model | run | scenes``.
"""
