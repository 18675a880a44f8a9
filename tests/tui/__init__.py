"""Tests of the Textual dashboard."""
