"""Every registered adapter declares every fact about its family (adding an architecture is one adapter
file plus one registration line), and the facts hold on a tiny model of each of its model types."""

from __future__ import annotations

import pytest
import torch

from retrofit.adapters import ADAPTERS, adapter_class, adapter_for
from retrofit.adapters.base import PositionTable

from ..tiny import TINY

FAMILY_OF = {t: name for name, cls in ADAPTERS.items() for t in cls.model_types}


@pytest.mark.parametrize("name", ADAPTERS.names())
def test_adapter_declares_its_facts(name):
    cls = ADAPTERS.get(name)
    assert cls.model_types and cls.attention_class_names and cls.native_kind in ("learned_absolute", "rope", "alibi")
    assert cls.lora_targets and all(isinstance(t, str) and t for t in cls.lora_targets)
    assert isinstance(cls.fan_in_fan_out, bool)
    assert (cls.position_table is not None) == (cls.native_kind == "learned_absolute"), name
    assert cls.position_table is None or isinstance(cls.position_table, PositionTable)
    assert all(adapter_class(t) is cls for t in cls.model_types)


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_facts_hold_on_a_tiny_model(model_type):
    model = TINY[model_type]()
    adapter = adapter_for(model)
    assert adapter.name == FAMILY_OF[model.config.model_type]
    leaves = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if not list(m.children())}
    targets = adapter.targets()  # what a fine-tune targets: the class's defaults, or read from the attention
    assert set(targets) <= leaves, f"{model_type}: LoRA targets {targets} not in {leaves}"
    conv1d = any(type(m).__name__ == "Conv1D" for m in model.modules())
    assert adapter.fan_in_fan_out == conv1d
    table = adapter.position_table
    if table is not None:  # the table's key, its size attribute and the row of position 0
        weight = model.state_dict()[table.key]
        assert weight.shape[0] == getattr(model.config, table.size_attr) + table.first_row
        assert isinstance(weight, torch.Tensor)
