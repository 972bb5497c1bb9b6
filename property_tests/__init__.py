"""Property-based tests of flexinfer_core (hypothesis); profiles in conftest.py."""
