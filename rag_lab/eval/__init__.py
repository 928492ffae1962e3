"""Evaluation: official-rule metrics, the batched resumable evaluation loop, tables."""
