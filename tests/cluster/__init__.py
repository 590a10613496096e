"""Test clusters started by the tests themselves (see conftest.py) and the tests that use them."""
