"""Immutable policy model, QDR policy file loading and validation, lookups and decisions."""
