"""Verifier runners."""
