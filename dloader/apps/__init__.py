"""Programs built on the library, not part of it: the emulated-accelerator testbed, the real
data pipelines it can run, the experiment harness (jobs with and without a sidecar) and the
demo. Benchmarks, tests and ``dloader-demo`` use them; a training script needs none of them.

* :mod:`.testbed`: emulated training jobs (``python -m dloader.apps.testbed --help``);
* :mod:`.pipelines`: real data pipelines (JPEG decode and augmentation, text packing, remote
  reads) for the testbed's ``image_jpeg``, ``text_pack`` and ``remote_read`` profiles;
* :mod:`.experiment`: several testbed jobs as processes, with or without a sidecar, scored;
* :mod:`.demo`: ``dloader-demo`` (``scripts/demo``).
"""
