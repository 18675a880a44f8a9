"""Panels of the dashboard, each a pure function of :mod:`tui.state` records."""
