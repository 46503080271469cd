"""The shell scripts that run on the GPU host cannot run here, but they must at least parse, and the A/B tool
must run on the tiny model: an error found there costs a device call."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("tools/*.sh"), *ROOT.glob("tests/gpu/*.sh"),
                                                    ROOT / ".ci" / "run"])


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_parses(script):
    r = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_gpu_lanes_runs_every_job_its_header_lists():
    text = (ROOT / "tools" / "gpu_lanes.sh").read_text()
    header = text[text.index("# Jobs"):text.index("# A job gets")]
    jobs = re.findall(r"^#   (\w+) {2,}", header, re.M)
    arms = re.findall(r"^    ([\w|]+)\)", text[text.index("case $job in"):text.index("esac")], re.M)
    handled = {job for arm in arms for job in arm.split("|")}
    assert len(jobs) >= 6 and set(jobs) <= handled, (jobs, handled)


def test_ab_attention_tool_runs_on_the_tiny_model():
    env = dict(os.environ, FASTGEN_SIZE="tiny", NEW="3", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "ab_attention.py"), "2"], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [row["mode"] for row in rows] == ["one_query", "sdpa", "sdpa", "one_query"]
    assert all(row["call_ms"] > 0 and row["batch"] == 2 and row["new_tokens"] == 3 for row in rows)


def test_probe_pace_runs_on_the_tiny_model(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "probe_pace.py"), str(tmp_path),
                        "--seconds", "0.3"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    import pandas as pd
    df = pd.read_csv(tmp_path / "pace.csv")
    assert set(df.phase) == set(range(6)) and (df.eager_ms > 0).all() and (df.pace_ms > 0).all()
    assert (tmp_path / "pace.png").stat().st_size > 0 and "recall" in r.stdout
