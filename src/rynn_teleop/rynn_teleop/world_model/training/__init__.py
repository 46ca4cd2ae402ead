"""Making and judging world-model weights from recorded episodes (ROS-free; torch only in the training steps).

Modules:

* ``clips``: the dataset folder's format (clips of 1 + 4k frames with actions and condition images);
* ``dataset``: clips from recorded episodes (``rynn-teleop world-model dataset``);
* ``tiny_base``: a stand-in base release for the ``tiny`` preset (``rynn-teleop world-model tiny-base``);
* ``config``: the run configs of ``train`` and ``distill`` (one YAML file per run, every key declared);
* ``flow``: the rectified-flow conventions the serving sampler uses, and the teacher's ODE;
* ``common``: clips to latents, base and weights folders, sample videos; ``loop``: the accelerate loop;
* ``train``: the stage-1 teacher (``rynn-teleop world-model train``);
* ``distill``: the causal 4-step student the node runs (``rynn-teleop world-model distill``);
* ``metrics`` and ``evaluate``: image metrics on held-out episodes (``rynn-teleop world-model eval``);
* ``objects``: the twin's object poses, boxes and first moves in recorded episodes;
* ``judge``: digital episodes' commands replayed on the twin beside what the generated video shows at the end
  (``rynn-teleop world-model judge``).

This package is a layer above ``world_model`` and ``recording`` (it reads both); neither imports it.
"""
