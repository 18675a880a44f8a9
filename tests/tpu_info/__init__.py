"""Tests of the CLI package: contract, wire, networking, host scan, views, outputs."""
