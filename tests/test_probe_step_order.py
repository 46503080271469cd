"""tools/probe_step_order.py: each kernel's share of the fused step's critical path, from a
profiler trace. Checked on made-up traces (a CPU has no CUDA kernels to profile): the shares
of a step add up to its span however its kernels overlap, each kernel gets its layer role, and
copies, memsets and steps with another kernel count stay out."""
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the probes' imports
import probe_step_order as probe  # noqa: E402


def trace(steps, per_step, overlap=0.0, extra=()):
    """Intervals as traces.profile_decode gives them: steps of `per_step` kernels, 10 µs apart,
    each lasting 10 + `overlap` µs (under PDL a kernel starts before the one ahead ends), one
    graph launch (correlation id) a step; `extra` rows appended as they are."""
    rows = []
    for s in range(steps):
        t0 = 1000.0 * s
        for i in range(per_step):
            rows.append((f"k{i}", 7, t0 + 10 * i - (overlap if i else 0), t0 + 10 * i + 10,
                         "kernel", s))
    rows += list(extra)
    return pd.DataFrame(rows, columns=["name", "stream", "start_us", "end_us", "cat",
                                       "correlation"])


@pytest.mark.parametrize("batch, per_layer", [(1, 4), (32, 5)])
@pytest.mark.parametrize("overlap", [0.0, 4.0])
def test_shares_add_up_to_the_step_and_roles_follow_the_layers(batch, per_layer, overlap):
    layers = 3
    n = layers * per_layer + 2
    d, steps = probe.step_kernels(trace(2, n, overlap), batch, layers)
    assert len(d) == 2 * n and len(steps) == 2
    for _, g in d.groupby("step"):
        span = float(steps.end_us.iloc[0] - steps.start_us.iloc[0])
        assert g.share_us.sum() == pytest.approx(span)
        assert g.us.iloc[1] == pytest.approx(10 + overlap)  # its own time overlaps the one ahead
        assert g.share_us.iloc[1] == pytest.approx(10)      # its share does not
    roles = d[d.step == 0].role.tolist()
    assert roles[:per_layer] == probe.ROLES[batch] and roles[per_layer] == "c_attn"
    assert roles[-2:] == ["lm_head", "token choice"]
    assert roles.count("c_fc") == layers


def test_copies_and_other_launches_stay_out():
    layers, n = 2, 2 * 5 + 2
    extra = [("Memcpy DtoH", 7, 50.0, 55.0, "gpu_memcpy", 0),      # inside step 0's span
             ("prefill", 7, 5000.0, 5100.0, "kernel", 99)]        # a launch of 1 kernel
    d, _ = probe.step_kernels(trace(2, n, extra=extra), 32, layers)
    assert len(d) == 2 * n and "Memcpy DtoH" not in set(d.kernel)
    assert set(d.step) == {0, 1}
