"""The embedded rollout engine (paged KV cache, continuous batching, seeded sampling)."""
