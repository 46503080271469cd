"""fastgen: fast autoregressive generation for a HuggingFace GPT-2, one optimization per
chapter. The names below load on first use (PEP 562): `import fastgen_lib` and
`python -m fastgen_lib --help` do not import torch."""
import importlib

__all__ = ["DECODERS", "generate", "load_model", "load_tokenizer", "make_batch",
           "reset", "set_eos_bias"]
__version__ = "0.1.0"

_HOME = {"DECODERS": "decoders", "generate": "decoders", "reset": "decoders",
         "load_model": "models", "load_tokenizer": "models", "make_batch": "models",
         "set_eos_bias": "models"}
_SUBMODULES = {"bench", "book", "decoders", "fused", "measure", "memory", "models", "registry",
               "plots", "reference", "steps", "stops", "traces", "widgets"}


def __getattr__(name):
    if name in _HOME:
        value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    elif name in _SUBMODULES:  # fastgen_lib.decoders after `import fastgen_lib`
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)
