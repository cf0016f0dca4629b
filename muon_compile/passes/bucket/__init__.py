"""bucket: single-device sites of one canonical shape become one batched op call (``plan``, ``apply``)."""
