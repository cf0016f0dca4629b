"""The torch.compile integration: the ``muon`` backend, the tracing helpers that keep a step in one
graph, the cache key, CUDA graphs, ``compile_step`` and the differences between torch versions."""
