"""Helpers for tests that run against the real device and driver."""
