import pytest
import torch

import muon_compile


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from a clean Dynamo state and counts its own pass decisions."""
    torch._dynamo.reset()
    muon_compile.counters.clear()
    yield
    torch._dynamo.reset()
