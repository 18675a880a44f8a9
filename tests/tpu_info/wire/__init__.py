"""Tests of tpu_info.wire."""
