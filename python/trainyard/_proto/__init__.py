"""Stubs generated from proto/*.proto by python/generate_stubs.py. Not a
public API: use the trainyard package; its Job and JobSpec are these
messages."""
