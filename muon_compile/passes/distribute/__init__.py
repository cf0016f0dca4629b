"""distribute: sharded sites become distributed buckets (``plan``), their stages (``apply``), tagged
with the vocabulary of ``stages``."""
