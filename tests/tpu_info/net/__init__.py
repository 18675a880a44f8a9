"""Tests of tpu_info.net."""
