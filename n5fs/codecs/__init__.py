"""Bytes <-> arrays for every codec the formats use; every decode is size-bounded."""
