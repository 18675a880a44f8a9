"""Tests of tpu_info.contract."""
