"""Whole-system and fault tests: real programs, forks, hostile peers, security."""
