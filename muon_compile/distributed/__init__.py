"""Sharded parameters: how a tensor's matrices lie across ranks (routing), the sharded op, and the
ranks' agreement before a graph with collectives compiles."""
