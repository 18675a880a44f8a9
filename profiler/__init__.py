"""Spans, step markers and trace capture (see the profiler issue).

Not built yet: importing it is cheap and safe.
"""
