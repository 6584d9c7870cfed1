"""The ``batchplan`` command line: one file per command, each an ``add_parser`` + ``run`` pair."""
