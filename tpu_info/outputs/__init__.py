"""Outputs: tables, JSON and the text report over the same views."""
