"""The names the command line offers, without importing torch (so `--help` is quick).
`decoders.DECODERS` and `bench.METHODS` must list the same names: tests/test_cli.py
checks it."""

DECODER_NAMES = ("naive", "kv_cache", "static_cache", "compiled", "deferred",
                 "interleaved", "fused", "gpu_loop")
HF_METHOD_NAMES = ("hf_dynamic", "hf_static")  # model.generate: default, static cache
