"""Tiny random-initialised models of the real classes, for the offline demo and the tests."""
