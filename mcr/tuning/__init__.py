"""Tuning: the table that maps (op, message size, group size, dtype) to a backend."""
