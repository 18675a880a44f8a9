"""Tests of tpu_info.proto."""
