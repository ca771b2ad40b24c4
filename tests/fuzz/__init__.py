"""Property-based (hypothesis) tests of the parsers that read untrusted or kernel-written input."""
