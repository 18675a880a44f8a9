"""Tests of metrics.engines."""
