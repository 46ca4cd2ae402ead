"""Making and judging world-model weights from recorded episodes (ROS-free; torch only in the training steps).

Modules:

* ``clips``: the dataset folder's format (clips of 1 + 4k frames with actions and condition images);
* ``dataset``: clips from recorded episodes (``rynn-teleop world-model dataset``);
* ``train``: the stage-1 teacher (``rynn-teleop world-model train``);
* ``distill``: the causal 4-step student the node runs (``rynn-teleop world-model distill``);
* ``evaluate``: image metrics on held-out episodes (``rynn-teleop world-model eval``).

This package is a layer above ``world_model`` and ``recording`` (it reads both); neither imports it.
"""
