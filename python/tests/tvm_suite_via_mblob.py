"""A pytest plugin that runs TVM's own test files with every ``export_library`` going through
``mblob.tvm.export_library`` (a regression suite for the ``mblob.tvm`` routes), by hand, in a
TVM virtualenv with mblob importable:

    MBLOB_PATCH=1 PYTHONPATH=python/tests python -m pytest -p tvm_suite_via_mblob \\
        <tvm>/tests/python/runtime/test_runtime_module_export.py \\
        <tvm>/tests/python/runtime/test_runtime_module_load.py \\
        <tvm>/tests/python/relax/test_vm_build.py

Without ``MBLOB_PATCH=1`` it does nothing (TVM's own run, to compare). ``MBLOB_PATCH_LOG=FILE``
appends one line per export that went through mblob.
"""

import os
import threading

if os.environ.get("MBLOB_PATCH") == "1":
    import tvm

    import mblob.tvm

    _orig = tvm.runtime.Module.export_library
    _inner = threading.local()

    def _export_library(self, file_name, *args, **kwargs):
        if getattr(_inner, "on", False):
            return _orig(self, file_name, *args, **kwargs)
        if args:
            (kwargs["fcompile"],) = args
        log = os.environ.get("MBLOB_PATCH_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')} {file_name} {sorted(kwargs)}\n")
        _inner.on = True
        try:
            return mblob.tvm.export_library(self, file_name, **kwargs)
        finally:
            _inner.on = False

    tvm.runtime.Module.export_library = _export_library
