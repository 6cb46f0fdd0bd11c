"""Test helpers shared by salvor's test suites."""
