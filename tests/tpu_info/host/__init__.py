"""Tests of tpu_info.host."""
