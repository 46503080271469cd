import os

import pytest
import torch

if not torch.cuda.is_available():
    # tests/test_fused.py runs the Triton kernels under Triton's CPU interpreter, which must be on
    # before anything imports triton (torch.compile does): triton.language's own @jit helpers are
    # made when triton is imported, and the interpreter cannot call compiled ones.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    # GPU tests run on the H200 through the device tool; on a machine without CUDA they skip cleanly.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
