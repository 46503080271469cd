"""lab/probe_loop.py's timing rows on the CPU, with calls of known length: the columns of
`measure.measure_calls`' rows, a step's time, and every round kept where `pace_slack` is None.
Outside the default test command: python -m pytest -p no:cacheprovider lab"""
import importlib.util
import math
import time
from pathlib import Path

import torch

from fastgen_lib import measure

spec = importlib.util.spec_from_file_location("probe_loop", Path(__file__).parent / "probe_loop.py")
probe_loop = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe_loop)
B, T, N = 2, 4, 6


def sleeper(step_s):
    """`call(n)`: n steps of `step_s` seconds, tokens [B, T + n] as generate returns them."""
    def call(n=N):
        time.sleep(step_s * n)
        return torch.zeros(B, T + n, dtype=torch.long)
    call.decode_attention = "sdpa"
    return call


def test_timed_rows_are_measure_calls_rows_with_every_round_kept_on_request():
    ids = torch.zeros(B, T, dtype=torch.long)
    calls = {"a": sleeper(0.004), "b": sleeper(0.008)}
    lib, _ = measure.measure_calls(None, ids, calls, N, repeats=3)
    for slack in (1.3, None):
        rows = probe_loop.timed_rows(None, ids, calls, N, repeats=3, pace_slack=slack)
        assert [list(r) for r in rows] == [list(r) for r in lib]
        a, b = (r["ms_per_step"] for r in rows)
        assert 3.5 < a < 6 and 1.6 < b / a < 2.4, (a, b)
        assert all(r["new_tokens"] == N and r["repeats"] == 3 and r["batch"] == B for r in rows)
    assert rows[0]["rounds"] == 3 and math.isnan(rows[0]["pace_ratio"])  # None: no round left out
