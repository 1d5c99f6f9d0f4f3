import logging
import os

import pytest
import torch

# Unit tests use the chunked kernel (flex compiles for ~15 s on CPU); test_kernel.py checks flex on its own.
os.environ.setdefault("RETROFIT_ATTENTION_PATH", "chunked")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))
logging.getLogger("transformers").setLevel(logging.ERROR)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
