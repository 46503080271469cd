"""The command line: `python -m fastgen_lib {check,generate,bench,memory,profile}`.

Arguments are checked before torch loads. A bad one, or a ValueError/TypeError from the
library, is one line `error: ...` on stderr and exit status 2 (FASTGEN_DEBUG=1 shows the
traceback instead)."""
import argparse
import json
import math
import os
import sys
import time

from .registry import DECODER_NAMES, METHODS, NEEDS, have

N_POSITIONS = 1024  # GPT-2's n_positions (124m, tiny): checked here; other models by the library
GPT2 = (None, "124m", "gpt2", "tiny")  # --size values that are GPT-2 (None: the default size)
VOCAB = 50257
CPU_NEW_TOKENS = 50  # bench's default on a CPU (100 on a GPU): the headline within 90 s on 2 cores


def fail(message):
    """One line on stderr and exit status 2 (argparse's status for a usage error)."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, like ours
        fail(f"{message} (see: {self.prog} --help)")


def cpu_threads():
    """torch threads for `bench` on a CPU: the usable cores, at most 4. The tiny
    model's steps are too small to gain from more; fewer leave the machine usable and
    the timings steadier."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def problem(args):
    """The first bad argument, in words, or None: checked before torch and the model."""
    if args.cmd == "generate":
        n, t, k, seed = args.max_new_tokens, args.temperature, args.top_k, args.seed
        checks = [
            (n >= 1, f"--max-new-tokens must be at least 1, got {n}"),
            (n < N_POSITIONS or args.size not in GPT2,
             f"--max-new-tokens ({n}) leaves no room for a prompt in GPT-2's {N_POSITIONS} "
             f"positions"),
            (all(args.prompt), "--prompt: an empty prompt has no token to start from"),
            (math.isfinite(t) and (t > 0 or not args.sample),  # as generate(): > 0 to sample
             f"--temperature must be a finite number (> 0 with --sample), got {t}"),
            (k is None or 1 <= k <= VOCAB or (k >= 1 and args.size not in GPT2),
             f"--top-k must be in [1, {VOCAB}], got {k}"),
            (0 <= seed < 2**32, f"--seed must be in [0, 2**32), got {seed}"),
        ]
    elif args.cmd in ("bench", "memory", "profile"):
        n, T, b = max(args.new_tokens), args.prompt_len, min(args.batch)
        checks = [
            (b >= 1, f"--batch must be at least 1, got {b}"),
            (min(args.new_tokens) >= 1,
             f"--new-tokens must be at least 1, got {min(args.new_tokens)}"),
            (T >= 1, f"--prompt-len must be at least 1, got {T}"),
            (T + n <= N_POSITIONS or args.size not in GPT2,
             f"prompt ({T}) + new tokens ({n}) exceeds GPT-2's {N_POSITIONS} "
             f"positions"),
            (args.repeats >= 1, f"--repeats must be at least 1, got {args.repeats}"),
        ]
        if args.cmd == "bench":
            unknown = [m for m in args.methods or [] if m not in METHODS] or [""]
            missing = [f for f in args.merge or [] if not os.path.exists(f)]
            checks += [
                (not unknown[0],
                 f"unknown method {unknown[0]!r}: choose from {', '.join(METHODS)}"),
                (args.threads is None or args.threads >= 1,
                 f"--threads must be at least 1, got {args.threads}"),
                (not args.merge or (args.out and not missing),
                 f"--merge needs existing CSVs and --out "
                 f"(missing: {', '.join(missing) or 'none'})"),
            ]
        else:
            one = len(args.batch) == len(args.new_tokens) == len(args.dtype) == 1
            checks.append((one, f"{args.cmd} measures one workload: give one --batch, "
                                f"one --new-tokens and one --dtype"))
    else:
        checks = []
    return next((msg for ok, msg in checks if not ok), None)


def need_cuda(cmd, why):
    """One line and exit 2 where there is no CUDA GPU, before the model loads."""
    import torch
    if not torch.cuda.is_available():
        fail(f"{cmd} needs a CUDA GPU, and this machine has none: {why}")


def cmd_check(args):
    """One line: what runs on this machine, or what is broken (then exit 1)."""
    import torch
    import transformers

    from . import models
    cuda = torch.cuda.is_available()
    problems = []
    if cuda:
        notes = [torch.cuda.get_device_name()]
    else:
        notes = ["CPU only: every chapter runs here with the tiny model and CPU "
                 "timings; the GPU chapters' numbers need CUDA"]
    try:  # the compiled decoders need it: Triton on a GPU, a C++ compiler on a CPU
        x = torch.ones(8, device="cuda" if cuda else "cpu")
        torch.compile(lambda t: t * 2 + 1)(x)
        if cuda:
            torch.cuda.synchronize()
    except Exception as exc:
        msg = " ".join(str(exc).split())[:80]
        problems.append(f"torch.compile fails on the {'GPU' if cuda else 'CPU'} "
                        f"({type(exc).__name__}: {msg})")
    try:
        models.load_tokenizer()
    except Exception as exc:
        problems.append(f"tokenizer files: {' '.join(str(exc).split())}")
    notes += [f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    if transformers.__version__ != "5.17.0":
        notes.append("(the book was built with transformers 5.17.0)")
    print(("READY: " if not problems else "NOT READY: ") + "; ".join(problems + notes))
    return 0 if not problems else 1


def cmd_generate(args):
    if len(args.prompt) > 1 and not any(" " in p for p in args.prompt):
        print(f"warning: {len(args.prompt)} one-word prompts, one row each; for one "
              f"prompt with spaces, quote it: --prompt \"{' '.join(args.prompt[:2])}\"",
              file=sys.stderr)
    import torch

    from . import decoders, models
    tok, n = models.load_tokenizer(args.size), args.max_new_tokens
    if args.stream and (len(args.prompt) != 1 or tok is None):
        fail("--stream prints one prompt's text as it is made: give one --prompt, and a model "
             "with a tokenizer" + ("" if tok is not None else f" ({args.size} has none here)"))
    if tok is not None:
        enc = tok(args.prompt, return_tensors="pt", padding=True)
        T = enc["input_ids"].shape[1]
        if T + n > N_POSITIONS and args.size in GPT2:
            fail(f"prompt ({T} tokens) + new tokens ({n}) exceeds GPT-2's {N_POSITIONS} "
                 f"positions")
    model = models.load_model(args.size, dtype=getattr(torch, args.dtype),
                              weights=args.weights)
    if tok is None:  # a random-weight shape: random prompts, token ids out
        print(f"note: {args.size} has no tokenizer here: {len(args.prompt)} random 16-token "
              "prompts, printed as token ids", file=sys.stderr)
        ids, mask = models.prompts_for(model, len(args.prompt))
    else:
        ids = enc["input_ids"].to(model.device)
        mask = enc["attention_mask"].to(model.device)
    kw = dict(decoder=args.decoder, max_new_tokens=n, do_sample=args.sample,
              temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    t0 = time.perf_counter()
    decoders.generate(model, ids, mask, **kw)  # first call: compiles and captures
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    first = time.perf_counter() - t0
    if args.stream:  # transformers' TextStreamer: the text printed as the tokens come
        from transformers import TextStreamer
        kw["streamer"] = TextStreamer(tok, skip_special_tokens=True)
    t0 = time.perf_counter()
    out = decoders.generate(model, ids, mask, **kw)
    sync()
    dt = time.perf_counter() - t0
    got = out.shape[1] - ids.shape[1]
    rows = [] if args.stream else (tok.batch_decode(out, skip_special_tokens=True) if tok
                                   else out.tolist())
    for row in rows:
        print(row)
        print("-" * 40)
    print(("-" * 40 + "\n" if args.stream else "")
          + f"{args.decoder} on {model.device} ({model.fastgen_weights} weights): {got} "
          f"tokens in {dt * 1e3:.1f} ms = {dt / got * 1e3:.2f} ms/token "
          f"(first call, with compilation: {first:.1f} s)")
    return 0


def cmd_bench(args):
    import pandas as pd
    import torch

    from . import bench, measure, plots
    from .models import default_size, load_model
    cuda = torch.cuda.is_available()
    for name in [] if args.merge else args.methods or []:
        missing = [n for n in METHODS[name].needs if not have(n)]
        if missing:
            fail(f"the {name} decoder needs {' and '.join(NEEDS[n] for n in missing)}, "
                 "which this machine has not")
    methods = args.methods or bench.runnable(
        bench.LADDER if args.sweep else METHODS if args.full else bench.HEADLINE)
    size = args.size or default_size()
    if args.merge:  # no measuring: CSVs of earlier runs (a sweep over GPUs) -> one CSV
        frames = [pd.read_csv(f) for f in args.merge]
        joined = pd.concat(frames)
        on_gpu = not joined.gpu.str.startswith("CPU").any()
        args.sweep, bw = any("sweep" in os.path.basename(f) for f in args.merge), None
        size = "124m" if on_gpu and joined.params_m.min() > 100 else "tiny"
    else:
        if args.threads or not cuda:
            torch.set_num_threads(args.threads or cpu_threads())
        if not cuda and not (args.tokens_given or args.sweep):
            args.new_tokens = [CPU_NEW_TOKENS]
        print(json.dumps(measure.conditions()), f"size={size}", " ".join(sys.argv),
              sep="\n")
        if not cuda:
            print(f"on the CPU with {torch.get_num_threads()} torch threads (--threads "
                  "to change)", flush=True)
        bw, frames = measure.measure_bandwidth(), []
    for dtype in [] if args.merge else args.dtype:
        model = load_model(size, dtype=getattr(torch, dtype))
        if not args.sweep:
            frames += [bench.ladder(model, b, args.prompt_len, n, methods, args.repeats,
                                    bw) for b in args.batch for n in args.new_tokens]
            continue
        # float32 is the article's setting: the whole grid; other dtypes the 100 column
        ns = [n for n in args.new_tokens if dtype == args.dtype[0] or n == 100]
        partial = None
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            partial = os.path.join(args.out, f"sweep_partial_{dtype}.csv")
        if ns:
            frames.append(bench.sweep(model, args.batch, ns, methods, args.repeats,
                                      args.prompt_len, bw, skip=bench.default_skip,
                                      checkpoint=partial))
    df = pd.concat(frames, ignore_index=True)
    if bw:
        print(f"measured device-to-device bandwidth: {bw / 1e12:.2f} TB/s")
    claims = bench.claims(df)
    with pd.option_context("display.width", 200, "display.max_columns", 30,
                           "display.float_format", "{:.3g}".format):
        for (b, n, d), g in df.groupby(["batch", "max_new_tokens", "dtype"]):
            print(f"\nbatch {b}, prompt {g.prompt_len.iloc[0]}, {n} new tokens, {d}:")
            print(bench.summary(g).drop(columns=["batch"]).to_string(index=False))
        stated = (cuda or args.merge) and size == "124m"
        if stated:
            print("\nclaims:\n" + claims.to_string(index=False))
        else:
            print(f"\nclaims: stated for GPT-2 124M on a GPU, not checked with the {size} "
                  f"model on this {'GPU' if cuda else 'CPU'} (bench.claims)")
    print("\n" + bench.legend(df))
    if not (cuda and size == "124m"):
        print(f"The book's GPU numbers (GPT-2 124M on an H200): {bench.GPU_RESULTS}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = "sweep" if args.sweep else "ladder"
        df.to_csv(os.path.join(args.out, f"{name}.csv"), index=False)
        claims.to_csv(os.path.join(args.out, f"{name}_claims.csv"), index=False)
        plots.save_bench_figures(df, args.out, name)
        print(f"wrote {args.out}/{name}.csv and figures")
    bad = df[~df.tokens_match]
    if len(bad):
        print(f"\nWARNING: {len(bad)} rows differ from model.generate:\n"
              f"{bad[['method', 'batch', 'divergence']]}")
    note = bench.pace_note(df)
    if note:
        print("\n" + note)
    return 0


def cmd_memory(args):
    """Fragmentation of one decoder in this process (run it under a PYTORCH_ALLOC_CONF
    of your choice)."""
    need_cuda("memory", "it measures PyTorch's CUDA caching allocator")
    import torch

    from . import measure, memory
    from .decoders import generate
    from .models import load_model, prompts_for
    model = load_model(args.size, dtype=getattr(torch, args.dtype[0]))
    ids, mask = prompts_for(model, args.batch[0], args.prompt_len)

    def call():
        return generate(model, ids, mask, decoder=args.decoder,
                        max_new_tokens=args.new_tokens[0])
    call()  # warm-up: compile and capture outside the measured run
    stats, _ = memory.memory_run(call, history=False)
    times, _ = measure.time_call(call, repeats=args.repeats, warmup=0)
    stats.update(decoder=args.decoder, batch=args.batch[0],
                 new_tokens=args.new_tokens[0], median_s=sorted(times)[len(times) // 2],
                 min_s=min(times), max_s=max(times),
                 env_alloc_conf=os.environ.get("PYTORCH_ALLOC_CONF", ""))
    print(json.dumps(stats) if args.json else stats)
    return 0


def cmd_profile(args):
    need_cuda("profile", "it measures the GPU's idle time between kernels, and a CPU "
                         "run has no GPU intervals")
    import torch

    from . import traces
    from .decoders import generate
    from .models import load_model, prompts_for
    model = load_model(args.size, dtype=getattr(torch, args.dtype[0]))
    ids, mask = prompts_for(model, args.batch[0], args.prompt_len)

    def call():
        return generate(model, ids, mask, decoder=args.decoder,
                        max_new_tokens=args.new_tokens[0])
    call()
    iv = traces.profile_decode(call, path=args.trace)
    gaps = traces.gpu_gaps(iv, steps=args.new_tokens[0])
    gaps.pop("gaps_us")
    print(json.dumps({"decoder": args.decoder, **gaps, **traces.between_steps(iv)}))
    if args.kernels:
        print(traces.top_kernels(iv).to_string())
    return 0


COMMANDS = {"check": cmd_check, "generate": cmd_generate, "bench": cmd_bench,
            "memory": cmd_memory, "profile": cmd_profile}


def parser():
    p = Parser(prog="python -m fastgen_lib", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    dtypes = ["float32", "bfloat16", "float16"]
    size_help = ("the model: 124m (= gpt2), tiny, llama-1b (Llama-3.2-1B's shape, random "
                 "weights), or a transformers model id or local path (default: FASTGEN_SIZE, "
                 "else 124m on CUDA, tiny on a CPU)")

    def common(sp, batch=(1,), new_tokens=(100,), note=""):
        sp.add_argument("--size", default=None, help=size_help)
        sp.add_argument("--dtype", nargs="+", default=["float32"], choices=dtypes)
        sp.add_argument("--batch", type=int, nargs="+", default=None,
                        help=f"default: {' '.join(map(str, batch))}")
        sp.add_argument("--new-tokens", type=int, nargs="+", default=None,
                        help=f"default: {' '.join(map(str, new_tokens))}{note}")
        sp.set_defaults(default_batch=list(batch), default_new_tokens=list(new_tokens))
        sp.add_argument("--prompt-len", type=int, default=16,
                        help=f"default: 16 (prompt + new tokens <= {N_POSITIONS})")
        sp.add_argument("--repeats", type=int, default=10,
                        help="timed rounds, methods alternated (default: 10)")

    sub.add_parser("check", help="one line: what runs here, or what is broken")
    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("--prompt", nargs="+", default=["The quick brown fox"],
                   help='one or more prompts, one row each; quote each prompt: '
                        '--prompt "Hello world" "Another prompt" (unquoted words are '
                        'separate prompts: a warning says so when every prompt is one '
                        'word)')
    g.add_argument("--decoder", choices=DECODER_NAMES, default="interleaved")
    g.add_argument("--max-new-tokens", type=int, default=40)
    g.add_argument("--size", default=None, help=size_help)
    g.add_argument("--dtype", default="float32", choices=dtypes)
    g.add_argument("--weights", default="auto",
                   choices=["auto", "pretrained", "random"])
    g.add_argument("--sample", action="store_true")
    g.add_argument("--temperature", type=float, default=1.0, help="> 0 (with --sample)")
    g.add_argument("--top-k", type=int, default=None,
                   help=f"1 to {VOCAB} (with --sample)")
    g.add_argument("--seed", type=int, default=0, help="0 to 2**32 - 1")
    g.add_argument("--stream", action="store_true",
                   help="print the text as it is made (one prompt; timed with the printing)")
    b = sub.add_parser("bench", help="the ladder of decoders beside model.generate")
    common(b, batch=(1, 32), new_tokens=(100,), note=f" ({CPU_NEW_TOKENS} on a CPU)")
    b.add_argument("--methods", nargs="+", default=None,
                   help=f"any of {', '.join(METHODS)} (default: the headline, "
                        "those of naive, interleaved, fused, gpu_loop and model.generate "
                        "that this machine runs)")
    b.add_argument("--full", action="store_true",
                   help="every method this machine runs, not only the headline")
    b.add_argument("--sweep", action="store_true",
                   help="the grid: batch x new tokens for the first dtype, the "
                        "100-token column for the others (eager methods only where "
                        "cheap: see bench.default_skip)")
    b.add_argument("--out", default=None,
                   help="folder for the CSV and figures (e.g. results/h200)")
    b.add_argument("--merge", nargs="+", default=None, metavar="CSV",
                   help="measure nothing: join these ladder/sweep CSVs into one, with "
                        "its claims and figures, in --out")
    b.add_argument("--threads", type=int, default=None,
                   help="torch threads (default on a CPU: the usable cores, at most 4)")
    m = sub.add_parser("memory", help="fragmentation of one decoder (needs CUDA)")
    common(m, batch=(8,), new_tokens=(200,))
    m.add_argument("--decoder", choices=DECODER_NAMES, default="kv_cache")
    m.add_argument("--json", action="store_true")
    pr = sub.add_parser("profile", help="GPU idle time of one decoder from a profiler "
                                        "trace (needs CUDA)")
    common(pr, batch=(1,), new_tokens=(50,))
    pr.add_argument("--decoder", choices=DECODER_NAMES, default="interleaved")
    pr.add_argument("--trace", default=None, help="where to keep the Chrome trace")
    pr.add_argument("--kernels", action="store_true",
                    help="also print the kernels that take the time")
    return p


def main(argv=None):
    args = parser().parse_args(argv)  # a bad argument exits here, with status 2
    if hasattr(args, "default_batch"):
        sweep = getattr(args, "sweep", False)
        args.batch = args.batch or ([1, 4, 8, 16, 32] if sweep else args.default_batch)
        args.tokens_given = args.new_tokens is not None
        args.new_tokens = args.new_tokens or ([50, 100, 200, 400] if sweep
                                              else args.default_new_tokens)
    msg = problem(args)
    if msg:
        fail(msg)
    try:
        return COMMANDS[args.cmd](args)
    except (ValueError, TypeError) as exc:  # the library's word on bad input: one line
        if os.environ.get("FASTGEN_DEBUG"):
            raise
        fail(exc)


if __name__ == "__main__":
    sys.exit(main())
