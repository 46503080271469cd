"""Every method fastgen times, declared once: the decoders (a step backend driven by a stop
driver) and the two `model.generate` calls they are measured beside. The command line,
`bench`, the plots, the widgets and the token checks read this table: adding a decoder is
one entry. No torch here, so `python -m fastgen_lib --help` stays quick."""
import functools
import importlib.util
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Method:
    name: str
    chapter: int
    label: str      # in legends and tables
    color: str      # the same in every figure
    # the model.generate keywords whose greedy tokens it gives (a model.generate row: its own)
    reference: dict = field(default_factory=dict)
    step: str = ""  # step backend, "module:Class" (how a step is computed); "": model.generate
    stop: str = ""  # stop driver, "module:name" (when the host learns every row has finished)
    needs: tuple = ()     # what the machine must have: "cuda", "triton", "cuda-bindings"
    families: tuple = ()  # the model types it runs; (): any causal LM with a static cache
    static: bool = False  # attends over all T + N cache slots, not only the ones filled
    headline: bool = False  # in `bench`'s default run, where the machine has what it needs


NEEDS = {"cuda": "a CUDA GPU", "triton": "Triton (it comes with torch's CUDA builds on Linux)",
         "cuda-bindings": "NVIDIA's cuda-bindings (pip install cuda-bindings)"}
FAMILIES = {"gpt2": "GPT-2 (GPT2LMHeadModel)"}  # model types in `Method.families`, in words
STATIC = dict(cache_implementation="static")
GRAPH = dict(step="steps:GraphStep", static=True)
FUSED = dict(step="fused:FusedStep", needs=("cuda", "triton"), families=("gpt2",), headline=True)

METHODS = {m.name: m for m in [
    Method("naive", 1, "naive (ch. 1)", "tab:blue", dict(use_cache=False),
           "steps:NaiveStep", "stops:every_step", headline=True),
    Method("kv_cache", 2, "kv_cache (ch. 2)", "tab:orange", {},
           "steps:DynamicStep", "stops:every_step"),
    Method("static_cache", 4, "static_cache (ch. 4)", "tab:green", STATIC,
           "steps:StaticStep", "stops:every_step", static=True),
    Method("compiled", 5, "compiled (ch. 5)", "tab:red", stop="stops:every_step", **GRAPH),
    Method("deferred", 7, "deferred (ch. 7)", "tab:purple", stop="stops:deferred", **GRAPH),
    Method("interleaved", 7, "interleaved (ch. 7)", "tab:brown", stop="stops:interleaved",
           headline=True, **GRAPH),
    Method("fused", 9, "fused (ch. 9)", "tab:olive", stop="stops:interleaved", **FUSED),
    Method("gpu_loop", 10, "gpu_loop (ch. 10)", "tab:cyan", stop="gpu_loop:gpu_loop",
           **{**FUSED, "needs": FUSED["needs"] + ("cuda-bindings",)}),
    Method("hf_dynamic", 8, "model.generate, dynamic cache", "tab:pink", headline=True),
    Method("hf_static", 8, "model.generate, static cache", "tab:gray", STATIC, static=True,
           headline=True),
]}
DECODER_NAMES = tuple(n for n, m in METHODS.items() if m.step)
HF_NAMES = tuple(n for n, m in METHODS.items() if not m.step)


@functools.cache
def have(need):
    """Whether this machine has `need` (a key of NEEDS): asked once a process."""
    if need == "cuda":
        import torch
        return torch.cuda.is_available()
    try:
        return importlib.util.find_spec(need.replace("-", ".")) is not None
    except ModuleNotFoundError:  # cuda.bindings without its parent package
        return False
