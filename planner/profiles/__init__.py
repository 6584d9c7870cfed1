"""Stage 2 of planning, the data: a device's memory and time curves over the batch size (``profile.DeviceProfile``),
whether they are physically possible (``checks``), the key that names a profile (``key``), the profiles in the
cache directory (``cache``), the profiles and the synchronisation a running job measured (``measured``,
``measured_sync``). How a profile is obtained: ``planner.obtain``. Torch-free.
"""
