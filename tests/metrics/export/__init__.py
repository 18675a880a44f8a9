"""Tests of metrics.export."""
