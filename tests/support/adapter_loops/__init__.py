"""The framework loops the adapter tests run, each a script for the
framework's scratch venv (tests/unit/test_adapters.py): it imports only
camg_client and its framework, plays the given tasks one episode at a time
against a camg service with a scripted model, and prints one JSON line per
episode."""
