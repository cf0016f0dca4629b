"""The stacked writes: a bucket's per-parameter writes become one (``stack_writes``), which reads the
Newton–Schulz result as ``lower`` left it (``write_source``)."""
