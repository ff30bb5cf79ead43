"""Toy extensions, one file per seam, each added with one registry line or a "module:attr"
string (test_extensions.py). A package so that spawned async engine processes import the toys
by the same names (`extensions.toy_engine`, ...): tests/ is on sys.path (tests/conftest.py)."""
