"""The shell scripts that run on the GPU host cannot run here, but they must at least parse, and the A/B tool
must run on the tiny model: an error found there costs a device call."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
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


def test_pace_monitor_samples_until_stopped_and_flags_slow_chapters(tmp_path):
    import signal
    import time

    import pandas as pd
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log = tmp_path / "pace_log.csv"
    mon = subprocess.Popen([sys.executable, str(ROOT / "tools" / "pace_monitor.py"), "run", str(log),
                            "--every", "0.2"], env=env)
    deadline = time.time() + 60
    while time.time() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 4):
        time.sleep(0.1)
    mon.send_signal(signal.SIGTERM)
    assert mon.wait(timeout=30) == 0
    pace = pd.read_csv(log)
    assert len(pace) >= 3 and (pace.pace_ms > 0).all() and pace.t_s.is_monotonic_increasing

    # a synthetic log: chapter a at 0.5 ms, b at 0.9 (slow), c without a sample (unknown: slow)
    pd.DataFrame({"t_s": [1, 2, 3, 11, 12], "pace_ms": [0.5, 0.6, 0.5, 0.9, 0.95]}).to_csv(log, index=False)
    chapters = tmp_path / "chapters.csv"

    def summary(rows):
        pd.DataFrame(rows, columns=["chapter", "start_s", "end_s"]).to_csv(chapters, index=False)
        return subprocess.run([sys.executable, str(ROOT / "tools" / "pace_monitor.py"), "summary",
                               str(log), str(chapters)], capture_output=True, text=True, env=env,
                              timeout=120)
    ok = summary([("a", 0, 5)])
    assert ok.returncode == 0 and "host at pace" in ok.stdout, ok.stdout + ok.stderr
    slow = summary([("a", 0, 5), ("b", 10, 13), ("c", 20, 30)])
    assert slow.returncode == 1 and "HOST SLOW" in slow.stdout and "during: b, c" in slow.stdout


def test_pace_gate_passes_a_host_at_pace_and_stops_a_slow_one():
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def gate(max_ms):
        return subprocess.run([sys.executable, str(ROOT / "tools" / "pace_monitor.py"), "gate",
                               "--max-ms", str(max_ms), "--samples", "3", "--every", "0"],
                              capture_output=True, text=True, env=env, timeout=120)
    ok = gate(1e6)  # any host is under a limit of 1000 s
    assert ok.returncode == 0 and "host at pace" in ok.stdout, ok.stdout + ok.stderr
    assert len(ok.stdout.split("pace ms:")[1].split("(median")[0].split()) == 3
    slow = gate(1e-9)  # and none under a nanosecond
    assert slow.returncode == 3 and "HOST SLOW" in slow.stdout, slow.stdout + slow.stderr


def test_count_ops_finds_the_padding_mask_on_the_tiny_model(tmp_path):
    # chapter 2's exercise 3 quotes this count (for GPT-2 124M): a padded batch dispatches more ops
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    out = tmp_path / "ops.csv"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "count_ops.py"), str(out), "tiny"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    import pandas as pd
    df = pd.read_csv(out).set_index("batch")
    assert list(df.padded_rows) == [0, 7, 27]
    assert df.ops_per_step[8] == df.ops_per_step[32] > df.ops_per_step[1] > 0


def test_probe_b32_runs_fresh_processes_on_the_tiny_model(tmp_path):
    """The plumbing of tools/probe_b32.py (a child process per run, its own inductor cache, the
    CSVs); the configs it is for exist only on a GPU, where inductor writes Triton kernels."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "probe_b32.py"), str(tmp_path), "1",
                        "tiny", "6"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    rows = pd.read_csv(tmp_path / "processes.csv")
    assert len(rows) == 1 and rows.b32_ms_per_step.iloc[0] > 0 and rows.b1_ms_per_step.iloc[0] > 0
    assert list(pd.read_csv(tmp_path / "configs.csv").columns) == ["process", "kernel", "config"]
