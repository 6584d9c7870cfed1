"""Data package: the GPU catalog (``gpus.yaml``) and example cluster configs (``*.yaml``).

No code lives here; the package exists so that ``importlib.resources`` finds the YAML files both in a
checkout and in an installed wheel (pyproject's ``package-data`` ships ``*.yaml``).
"""
