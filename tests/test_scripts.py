"""The scripts (scripts/) that run on the GPU host cannot run here, but each must start and parse
its arguments, and the pace monitor must work: an error found there costs a device call."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHELL = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("scripts/*.sh"), ROOT / ".ci" / "run"])
PYTHON = ["make_student.py", "pace_monitor.py", "run_notebooks.py", "set_repo.py"]  # each with --help
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def test_every_script_is_checked_here():
    # ci_extra.sh takes no arguments (CI runs it whole): bash -n only
    assert sorted(p.name for p in (ROOT / "scripts").iterdir() if p.is_file()) == sorted(
        PYTHON + ["ci_extra.sh", "gpu.sh"])


@pytest.mark.parametrize("script", SHELL)
def test_script_parses(script):
    r = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("script", PYTHON)
def test_python_script_starts_and_parses_its_arguments(script):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--help"],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stdout + r.stderr


def gpu(*args):
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu.sh"), *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args, settings", [
    (["book", "--dry", "--out", "o", "--gate", "0.62", "09_fused", "10_gpu_loop"],
     ["job=book out=o", "gate=0.62", "keep_going=0", "args=09_fused 10_gpu_loop"]),
    (["book", "--dry", "--pin", "0-3", "--pace-max", "0.7", "--keep-going", "00_setup"],
     ["pin=0-3", "pace_max=0.7", "keep_going=1"]),
    (["tests", "--dry", "-k", "fused or gpu_loop", "--budget", "300", "--stress", "50"],
     ["job=tests out=results/gpu", "budget=300", "stress=50", "k=fused or gpu_loop",
      "args=pytest"]),
    (["tests", "--dry", "pytest", "sanitizer"], ["args=pytest sanitizer"]),
    (["smoke", "--dry"], ["job=smoke out=gpu_out"]),
])
def test_gpu_runner_parses_its_jobs(args, settings):
    r = gpu(*args)
    assert r.returncode == 0 and all(s in r.stdout for s in settings), r.stdout + r.stderr


@pytest.mark.parametrize("args", [["deploy"], [], ["book", "--dry"], ["book", "--dry", "99_none"],
                                  ["tests", "--dry", "lint"], ["tests", "--bogus"],
                                  ["smoke", "--dry", "x"], ["book", "--dry", "--out"]])
def test_gpu_runner_refuses_what_it_would_not_run(args):
    r = gpu(*args)
    assert r.returncode != 0 and r.stderr, r.stdout


def test_gpu_runner_help_names_every_job():
    r = gpu("--help")
    assert r.returncode == 0
    assert all(f"bash scripts/gpu.sh {job}" in r.stdout for job in ("book", "tests", "smoke"))


def test_pace_monitor_samples_until_stopped_and_flags_slow_chapters(tmp_path):
    import signal
    import time

    import pandas as pd
    env = ENV
    log = tmp_path / "pace_log.csv"
    mon = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "pace_monitor.py"), "run", str(log),
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
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "pace_monitor.py"), "summary",
                               str(log), str(chapters)], capture_output=True, text=True, env=env,
                              timeout=120)
    ok = summary([("a", 0, 5)])
    assert ok.returncode == 0 and "host at pace" in ok.stdout, ok.stdout + ok.stderr
    slow = summary([("a", 0, 5), ("b", 10, 13), ("c", 20, 30)])
    assert slow.returncode == 1 and "HOST SLOW" in slow.stdout and "during: b, c" in slow.stdout


def test_pace_gate_passes_a_host_at_pace_and_stops_a_slow_one():
    env = ENV

    def gate(max_ms):
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "pace_monitor.py"), "gate",
                               "--max-ms", str(max_ms), "--samples", "3", "--every", "0"],
                              capture_output=True, text=True, env=env, timeout=120)
    ok = gate(1e6)  # any host is under a limit of 1000 s
    assert ok.returncode == 0 and "host at pace" in ok.stdout, ok.stdout + ok.stderr
    assert len(ok.stdout.split("pace ms:")[1].split("(median")[0].split()) == 3
    slow = gate(1e-9)  # and none under a nanosecond
    assert slow.returncode == 3 and "HOST SLOW" in slow.stdout, slow.stdout + slow.stderr
