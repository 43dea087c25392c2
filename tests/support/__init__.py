"""Helpers the tests share: builders, launchers and seeders (fixtures live in tests/conftest.py).

A test module imports helpers from here (`from tests.support.app import make_env`),
never from another test module: a test file is free to change without breaking
others.
"""
