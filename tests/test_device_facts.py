"""The H200 reference deployments' facts match the device they describe (GPU only)."""
from __future__ import annotations

import pytest

from detent_rl.kernels.programs.registry import programs

pytestmark = pytest.mark.gpu


def test_reference_facts_match_the_h200():
    import torch

    props = torch.cuda.get_device_properties(0)
    if "H200" not in props.name and "H100" not in props.name:
        pytest.skip(f"reference facts describe an H100/H200, this is {props.name}")
    sms = props.multi_processor_count
    smem = getattr(props, "shared_memory_per_block_optin", None)
    checked = 0
    for name, (_, deployments) in programs().items():
        for dep, facts in deployments.items():
            for key in ("num_sms", "device_core_count"):
                if key in facts:
                    assert facts[key] == sms, f"{name}/{dep}: {key}={facts[key]}, device has {sms} SMs"
                    checked += 1
            if "smem_bytes" in facts and smem is not None:
                assert facts["smem_bytes"] <= smem, f"{name}/{dep}: smem_bytes above the device's {smem}"
                checked += 1
            if "arch" in facts:
                assert facts["arch"] == props.major * 10 + props.minor
                checked += 1
    assert checked >= 5
