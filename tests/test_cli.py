"""Every command starts and parses its arguments where no GPU is (a GPU-only script
nobody runs rots). Bad arguments: one line `error: ...`, exit 2, before torch loads."""
import json
import os
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from fastgen_lib.__main__ import main

ENV = dict(os.environ, FASTGEN_SIZE="tiny", HF_HUB_OFFLINE="1")
CUDA = torch.cuda.is_available()


def cli(*args, env=ENV):
    return subprocess.run([sys.executable, "-m", "fastgen_lib", *args],
                          capture_output=True, text=True, env=env, timeout=600)


# runs main(argv), then says on its last line whether torch was imported on the way
NO_TORCH = """import sys
from fastgen_lib.__main__ import main
try:
    main(sys.argv[1:])
finally:
    print("torch" in sys.modules, "transformers" in sys.modules)
"""


def cli_torch_free(*args):
    return subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True,
                          text=True, env=ENV, timeout=120)


def one_line_error(p):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


@pytest.mark.parametrize("cmd", ["check", "generate", "bench", "memory", "profile"])
def test_help(cmd):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0


def test_help_is_quick_and_loads_no_torch():
    t0 = time.perf_counter()
    p = cli("--help")
    assert p.returncode == 0 and "usage:" in p.stdout
    assert time.perf_counter() - t0 < 5  # torch alone takes seconds to import
    for cmd in ("generate", "bench"):
        p = cli_torch_free(cmd, "--help")
        assert p.returncode == 0, p.stderr
        assert p.stdout.splitlines()[-1] == "False False", p.stdout


@pytest.mark.parametrize("args, says", [
    (["generate", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["generate", "--max-new-tokens", "1024"], "leaves no room for a prompt"),
    (["generate", "--sample", "--temperature", "0"], "--temperature must be a finite number (> 0"),
    (["generate", "--temperature", "nan"], "--temperature must be a finite number"),
    (["generate", "--top-k", "0"], "--top-k must be in [1, 50257]"),
    (["generate", "--seed", "-1"], "--seed must be in [0, 2**32)"),
    (["generate", "--seed", str(2**32)], "--seed must be in [0, 2**32)"),
    (["generate", "--prompt", ""], "empty prompt"),
    (["generate", "--decoder", "warp_drive"], "invalid choice: 'warp_drive'"),
    (["bench", "--new-tokens", "2000"],
     "error: prompt (16) + new tokens (2000) exceeds GPT-2's 1024 positions"),
    (["bench", "--batch", "0"], "--batch must be at least 1"),
    (["bench", "--batch", "two"], "invalid int value: 'two'"),
    (["bench", "--prompt-len", "0"], "--prompt-len must be at least 1"),
    (["bench", "--repeats", "0"], "--repeats must be at least 1"),
    (["bench", "--threads", "0"], "--threads must be at least 1"),
    (["bench", "--methods", "warp_drive"], "unknown method 'warp_drive'"),
    (["memory", "--batch", "1", "2"], "memory measures one workload"),
    (["profile", "--prompt-len", "1000", "--new-tokens", "50"], "exceeds GPT-2's 1024"),
])
def test_bad_arguments_are_one_line_before_torch(args, says):
    p = cli_torch_free(*args)
    assert says in one_line_error(p)
    assert p.stdout.splitlines() == ["False False"]  # refused before torch was imported


def test_a_library_error_is_one_line():
    # a ValueError raised inside a command (here models.default_size's): no traceback
    p = cli("generate", "--max-new-tokens", "2", env=dict(ENV, FASTGEN_SIZE="huge"))
    assert "FASTGEN_SIZE='huge'" in one_line_error(p)


def test_a_long_prompt_is_refused_before_the_model_loads():
    p = cli("generate", "--max-new-tokens", "1023")  # "The quick brown fox": 4 tokens
    assert "prompt (4 tokens) + new tokens (1023) exceeds" in one_line_error(p)


@pytest.mark.skipif(CUDA, reason="what `check` says on a machine without CUDA")
def test_check_on_a_cpu_is_ready_in_one_line():
    p = cli("check")
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(lines) == 1 and lines[0].startswith("READY: CPU only")
    assert "tiny model" in lines[0] and "need CUDA" in lines[0]


def test_check_prints_one_line():
    p = cli("check")
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(("READY", "NOT READY"))


def test_generate_prints_text_and_time():
    p = cli("generate", "--prompt", "Hello there", "--max-new-tokens", "5",
            "--decoder", "kv_cache")
    assert p.returncode == 0, p.stderr
    assert "Hello there" in p.stdout and "ms/token" in p.stdout
    assert "warning" not in p.stderr


def test_generate_streams_one_prompt():
    p = cli("generate", "--prompt", "Hello there", "--max-new-tokens", "6", "--stream")
    assert p.returncode == 0, p.stderr
    text, timing = p.stdout.split("-" * 40)
    assert text.startswith("Hello there") and len(text.strip()) > len("Hello there")
    assert "ms/token" in timing and "warning" not in p.stderr


def test_stream_needs_one_prompt():
    assert "give one --prompt" in one_line_error(cli("generate", "--prompt", "a b", "c d", "--stream"))


def test_unquoted_prompt_words_warn():
    p = cli("generate", "--prompt", "Hello", "world", "--max-new-tokens", "2",
            "--decoder", "kv_cache")
    assert p.returncode == 0, p.stderr
    assert 'warning: 2 one-word prompts, one row each' in p.stderr
    assert '--prompt "Hello world"' in p.stderr
    assert p.stdout.count("-" * 40) == 2  # two prompts as given: the warning explains


def test_bench_on_the_tiny_model(tmp_path):
    p = cli("bench", "--batch", "1", "--new-tokens", "4", "--repeats", "1", "--out",
            str(tmp_path), "--methods", "naive", "kv_cache", "static_cache",
            "hf_dynamic")
    assert p.returncode == 0, p.stderr
    assert "x_vs_hf_static" in p.stdout and "claims:" in p.stdout
    assert "ttft_ms: time to first token" in p.stdout  # the legend under the table
    assert "results/h200/" in p.stdout and "NOTE" not in p.stdout
    assert "not checked with the tiny model" in p.stdout  # the claims are stated for 124M
    assert (tmp_path / "ladder.csv").exists()
    assert (tmp_path / "ladder_b1_n4_float32.png").exists()
    if not CUDA:
        assert "torch threads" in p.stdout
        claims = pd.read_csv(tmp_path / "ladder_claims.csv")
        assert (claims.holds == "n/a on CPU").all()


def test_bench_runs_the_headline_by_default(tmp_path):
    from fastgen_lib import bench
    p = cli("bench", "--batch", "1", "--new-tokens", "3", "--repeats", "1", "--out",
            str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "%|" in p.stderr  # the progress bar, over every call
    got = list(pd.read_csv(tmp_path / "ladder.csv").method)
    assert got == bench.runnable(bench.HEADLINE) and "interleaved" in got
    if not CUDA:
        assert "needs a CUDA GPU" in one_line_error(cli("bench", "--methods", "fused"))


def test_claims_on_cpu_rows_are_not_applicable():
    from fastgen_lib import bench
    times = dict(naive=15, interleaved=1, hf_static=1.5)
    rows = [dict(method=m, batch=b, max_new_tokens=100, dtype="float32", median_s=t)
            for b in (1, 32) for m, t in times.items()]
    gpu = bench.claims(pd.DataFrame(rows).assign(gpu="NVIDIA H200"))
    cpu = bench.claims(pd.DataFrame(rows).assign(gpu="CPU (x86_64)"))
    assert gpu.holds.tolist()[:4] == [False, False, True, True]
    assert (cpu.holds == "n/a on CPU").all()
    assert cpu.measured.tolist() == gpu.measured.tolist()  # measured all the same
    assert bench.claims(pd.DataFrame(rows).assign(gpu="CPU"), on_gpu=True).holds[3]


@pytest.mark.skipif(CUDA, reason="what memory/profile say on a machine without CUDA")
@pytest.mark.parametrize("args", [["memory"], ["profile"], ["profile", "--kernels"]])
def test_memory_and_profile_need_cuda(args):
    t0 = time.perf_counter()
    p = cli(*args, "--decoder", "kv_cache", "--new-tokens", "3")
    assert "needs a CUDA GPU" in one_line_error(p) and p.stdout == ""
    assert time.perf_counter() - t0 < 60  # refused before the model loads and warms up


@pytest.mark.gpu
def test_profile_prints_json():
    p = cli("profile", "--decoder", "kv_cache", "--new-tokens", "3")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["decoder"] == "kv_cache"


def test_bench_merge_joins_csvs_without_measuring(tmp_path):
    # the saved H200 sweep split in two, as two GPUs would write it, joins back into the
    # same claims
    from fastgen_lib import bench
    full = pd.read_csv("results/h200/sweep.csv")
    full[full.batch <= 8].to_csv(tmp_path / "sweep_a.csv", index=False)
    full[full.batch > 8].to_csv(tmp_path / "sweep_b.csv", index=False)
    p = cli("bench", "--merge", str(tmp_path / "sweep_a.csv"),
            str(tmp_path / "sweep_b.csv"), "--out", str(tmp_path / "joined"))
    assert p.returncode == 0, p.stderr
    assert "not checked" not in p.stdout and "claims:\n" in p.stdout  # H200 rows: they stand
    joined = pd.read_csv(tmp_path / "joined" / "sweep.csv")
    assert len(joined) == len(full)
    cols = ["claim", "measured"]
    saved = pd.read_csv(tmp_path / "joined" / "sweep_claims.csv")[cols]
    pd.testing.assert_frame_equal(bench.claims(full)[cols], saved, check_dtype=False)
    assert (tmp_path / "joined" / "sweep_tokens_per_s_float32.png").exists()


def test_bench_merge_needs_files_and_out(tmp_path):
    p = cli_torch_free("bench", "--merge", str(tmp_path / "nothing.csv"))
    assert "--merge needs" in one_line_error(p)


def test_any_causal_lm_by_path_without_a_tokenizer(tmp_path):
    # a local Llama checkpoint (what a model id resolves to) with no tokenizer files: random prompts,
    # said once on stderr, token ids out; an unknown name is one line, exit 2
    import transformers as T
    torch.manual_seed(0)
    T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=128, num_key_value_heads=2,
        eos_token_id=5)).save_pretrained(tmp_path)
    r = cli("generate", "--size", str(tmp_path), "--max-new-tokens", "3", "--decoder", "kv_cache",
            "--prompt", "a", "b")
    assert r.returncode == 0, r.stderr
    assert "has no tokenizer here: 2 random 16-token prompts" in r.stderr
    assert r.stdout.count("[") == 2 and "kv_cache on cpu" in r.stdout
    bad = cli("generate", "--size", str(tmp_path / "missing"), "--max-new-tokens", "3")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: model")


def test_temperature_counts_only_with_sample():
    # the help's "> 0 (with --sample)", as generate() has it: greedy decoding ignores it
    p = cli("generate", "--temperature", "0", "--max-new-tokens", "2", "--decoder", "kv_cache")
    assert p.returncode == 0, p.stderr


def test_a_missing_path_and_an_unreachable_hub_are_one_line(tmp_path):
    t0 = time.perf_counter()
    assert "no such folder" in one_line_error(cli("generate", "--size", "./no/such/model"))
    import socket
    hub = socket.socket()  # takes connections, never answers: a hub behind a dropping firewall
    hub.bind(("127.0.0.1", 0))
    hub.listen(256)
    env = {k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{hub.getsockname()[1]}"
    line = one_line_error(cli("generate", "--size", "someone/some-model", env=env))
    hub.close()
    assert "HF_HUB_OFFLINE=1" in line and "local path" in line
    assert time.perf_counter() - t0 < 60  # two starts of torch; huggingface_hub alone: minutes
