"""The test suite; folders mirror the packages."""
