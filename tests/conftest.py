import pytest
import torch


def pytest_collection_modifyitems(config, items):
    # GPU tests run on the H200 through the device tool; on a machine without CUDA they skip cleanly.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
