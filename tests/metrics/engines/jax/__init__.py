"""Tests of metrics.engines.jax."""
