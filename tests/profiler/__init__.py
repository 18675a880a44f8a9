"""Tests of the profiler: spans, captures, trace formats."""
