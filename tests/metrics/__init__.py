"""Tests of the in-process hook: recording, engines, export."""
