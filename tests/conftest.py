import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import the float64 oracles from oracle.py


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
