"""Tests of metrics.engines.torch."""
