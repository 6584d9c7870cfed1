"""Byte units, defined once: GiB is 2^30 bytes and is called GiB (STYLE.md). Pure Python."""

MIB = 2**20
GIB = 2**30
