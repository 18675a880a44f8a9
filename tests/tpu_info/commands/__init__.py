"""Tests of tpu_info.commands."""
