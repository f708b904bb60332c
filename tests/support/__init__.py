"""Helpers the tests share, one concept a module; no test file imports another test file."""
