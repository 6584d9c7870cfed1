"""The seed toolkit (Ultralytics ``torch_utils.py``, ``autodevice.py``, ``autobatch.py``) re-implemented, one
topic a module. Every public name is exported lazily from ``torchkit`` itself (``from torchkit import
select_device``); import from here only for names that are not part of that API."""
