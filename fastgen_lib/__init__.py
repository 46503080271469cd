"""fastgen: fast autoregressive generation for a HuggingFace GPT-2, one optimization per chapter."""
from .decoders import DECODERS, generate
from .models import load_model, load_tokenizer, make_batch, set_eos_bias

__all__ = ["DECODERS", "generate", "load_model", "load_tokenizer", "make_batch", "set_eos_bias"]
__version__ = "0.1.0"
