"""Screens of the dashboard: main, graph detail, help (one per module)."""
