"""Readers: the only code that touches the OS, IMDS or AWS; they read and parse, never decide."""
