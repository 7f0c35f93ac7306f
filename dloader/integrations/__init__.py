"""Integrations of dloader with launchers and frameworks: torchrun elastic resume
(:mod:`.torchrun`), ``dloader-launch`` (:mod:`.launcher`), Hugging Face Accelerate
(:mod:`.accelerate`) and Trainer (:mod:`.transformers`); for Lightning, a callback that declares
the run's length (:mod:`.lightning`).

They use dloader's public API (``dloader``, ``dloader.elastic``, ``dloader.errors``), what every
client shares (``dloader._shared``: the typed messages, the client, the environment) and three
documented internal APIs of the loader (``tests/test_layout.py`` allows no other):

* :mod:`dloader._engine.ranks`: this process's rank and world, and the collectives dloader uses;
* :class:`dloader._engine.index_stream.SamplerSnapshot`: what a sampler's order comes from, so
  that a sampler that wraps another can resume it;
* :func:`dloader._elastic_sampler.check_rank`: the rank and world-size check of
  :class:`dloader.ElasticDistributedSampler`.
"""
