"""Tests of tpu_info.outputs."""
