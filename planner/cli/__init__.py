"""The ``batchplan`` command line: one file per command, each an ``add_parser`` + ``run`` pair.

- the commands: ``plan``, ``preflight``, ``show``, ``profile``, ``devices``, ``catalog``, ``advise`` (and
  ``advise_render``, how it prints); ``main`` the entry point that dispatches to them;
- what several share: ``options`` (job and cluster flags), ``spec_flags`` (flags derived from a typed spec),
  ``model_names`` (``--model`` checked before any probing), ``planning`` (the gathering ``plan`` and
  ``preflight`` share), ``user_code`` (saying that a user's factory will run);
- output: ``output`` (tables, JSON), ``render`` (a plan as text), ``emit_env`` (``--emit env``), ``plot``
  (pictures), ``progress`` (stderr progress), ``json_error`` (one JSON document on a failed ``--json`` run),
  ``stdout_guard`` (stdout carries only the result), ``signals`` (SIGTERM handled as Ctrl-C).
"""
