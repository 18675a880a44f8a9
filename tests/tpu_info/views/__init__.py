"""Tests of tpu_info.views."""
