"""Every command starts and parses its arguments where no GPU is (a GPU-only script nobody runs rots)."""
import json
import os
import subprocess
import sys

import pytest

from fastgen_lib.__main__ import main

ENV = dict(os.environ, FASTGEN_SIZE="tiny", HF_HUB_OFFLINE="1")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "fastgen_lib", *args], capture_output=True, text=True, env=ENV,
                          timeout=600)


@pytest.mark.parametrize("cmd", ["check", "generate", "bench", "memory", "profile"])
def test_help(cmd):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0


def test_check_prints_one_line():
    p = cli("check")
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(("READY", "NOT READY"))


def test_generate_prints_text_and_time():
    p = cli("generate", "--prompt", "Hello there", "--max-new-tokens", "5", "--decoder", "kv_cache")
    assert p.returncode == 0, p.stderr
    assert "Hello there" in p.stdout and "ms/token" in p.stdout


def test_bench_on_the_tiny_model(tmp_path):
    p = cli("bench", "--batch", "1", "--new-tokens", "4", "--repeats", "1", "--out", str(tmp_path),
            "--methods", "naive", "kv_cache", "static_cache", "hf_dynamic")
    assert p.returncode == 0, p.stderr
    assert "x_vs_naive" in p.stdout and "claims:" in p.stdout
    assert "they only show that the code runs" in p.stdout  # the tiny model's claims are not the H200's
    assert (tmp_path / "ladder.csv").exists() and (tmp_path / "ladder_b1_n4_float32.png").exists()


def test_bad_method_is_a_clear_error():
    p = cli("bench", "--methods", "warp_drive")
    assert p.returncode != 0 and "unknown method 'warp_drive'" in p.stderr


def test_profile_prints_json():
    p = cli("profile", "--decoder", "kv_cache", "--new-tokens", "3")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["decoder"] == "kv_cache"


def test_bench_merge_joins_csvs_without_measuring(tmp_path):
    # the saved H200 sweep split in two, as two GPUs would write it, joins back into the same claims
    import pandas as pd
    from fastgen_lib import bench
    full = pd.read_csv("results/h200/sweep.csv")
    full[full.batch <= 8].to_csv(tmp_path / "sweep_a.csv", index=False)
    full[full.batch > 8].to_csv(tmp_path / "sweep_b.csv", index=False)
    p = cli("bench", "--merge", str(tmp_path / "sweep_a.csv"), str(tmp_path / "sweep_b.csv"),
            "--out", str(tmp_path / "joined"))
    assert p.returncode == 0, p.stderr
    assert "only show that the code runs" not in p.stdout  # H200 rows: the claims stand
    joined = pd.read_csv(tmp_path / "joined" / "sweep.csv")
    assert len(joined) == len(full)
    cols = ["claim", "measured"]
    pd.testing.assert_frame_equal(bench.claims(full)[cols], pd.read_csv(tmp_path / "joined" / "sweep_claims.csv")[cols],
                                  check_dtype=False)
    assert (tmp_path / "joined" / "sweep_tokens_per_s_float32.png").exists()


def test_bench_merge_needs_files_and_out(tmp_path):
    p = cli("bench", "--merge", str(tmp_path / "nothing.csv"))
    assert p.returncode != 0 and "--merge needs" in p.stderr
