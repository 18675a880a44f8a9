"""Tests of metrics.recording."""
