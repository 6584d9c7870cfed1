"""Stage 2 of planning: a device's memory and time curves over the batch size (``profile.DeviceProfile``), the key
that names a profile (``key``) and the on-disk cache of profiles (``cache``). Torch-free."""
