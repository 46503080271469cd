"""Every decoder on other decoder-only families (issue 15), with tiny random configs on the CPU: Llama,
Qwen2, Mistral (grouped-query and multi-query attention), Qwen3 (query and key norms), Phi-3 (fused
projections), Gemma 2 (sliding-window layers shorter than the sequence, softcapped logits), Bloom
(ALiBi, an attention transformers cannot switch), GPT-NeoX and OPT. Each must give
`model.generate`'s greedy tokens with mixed-length left padding and rows that stop apart, with one EOS
id (Llama, Mistral, ...) or a list of them (Qwen2, Qwen3, ...); sampling with a seed is equal across
decoders. Models the decoders cannot run get a ValueError naming the model type."""
import pytest
import torch
import transformers as T

import fastgen_lib as fg
from fastgen_lib.reference import HF_REFERENCE, first_divergence, hf_generate
from fastgen_lib.steps import grouped_one_query_attention

VOCAB, EOS, PAD, N = 300, 5, 0, 12
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=128, max_position_embeddings=128)
FAMILIES = {
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=2, **COMMON)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(num_key_value_heads=2, **COMMON)),
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(num_key_value_heads=1,
                                                            sliding_window=None, **COMMON)),
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(num_key_value_heads=2, head_dim=16, **COMMON)),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(  # one qkv and one gate_up projection
        num_key_value_heads=2, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=1, **COMMON)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(  # every other layer's window: 8 of 19
        num_key_value_heads=2, head_dim=16, sliding_window=8, **COMMON)),  # positions; softcapping
    "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(  # ALiBi; attention that transformers
        vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)),  # cannot switch (its own kept)
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**COMMON)),
    "opt": lambda: T.OPTForCausalLM(T.OPTConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
        max_position_embeddings=128, word_embed_proj_dim=64)),
}
FAMILY_DECODERS = [d for d in fg.DECODERS if d not in ("fused", "gpu_loop")]  # GPT-2 only


def test_fused_refuses_another_family_before_it_runs():
    model = FAMILIES["llama"]().eval()
    ids, mask = fg.make_batch(2, 5, vocab_size=VOCAB, seed=1, pad_token_id=PAD)
    with pytest.raises(ValueError, match="GPT-2"):
        fg.generate(model, ids, mask, decoder="fused", max_new_tokens=4)


def stop_steps(out, T_):
    return {int((row == EOS).nonzero()[0]) if (row == EOS).any() else None for row in out[:, T_:]}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    """(name, model, ids, mask, EOS bias that makes rows stop at different steps)."""
    torch.manual_seed(0)
    model = FAMILIES[request.param]().eval()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = PAD, EOS
    with torch.no_grad():  # sharper logits than random init: fewer near-ties (the tied heads of
        # OPT, Gemma 2 and Bloom less: their embeddings scale too, and no EOS bias then tells rows apart)
        sharpen = {"opt": 1, "gemma2": 1, "bloom": 3}.get(request.param, 20)
        model.get_output_embeddings().weight.mul_(sharpen)
    ids, mask = fg.make_batch(4, 7, vocab_size=VOCAB, seed=1, pad_token_id=PAD)
    for bias in (0.5, 2.0, 4.0, 6.0, 8.0, 10.0, 14.0):
        fg.set_eos_bias(model, bias, eos_token_id=EOS)
        steps = stop_steps(hf_generate(model, ids, mask, N, EOS, PAD), ids.shape[1])
        if len(steps) >= 2:  # rows stop at different steps (or some never)
            return request.param, model, ids, mask, bias
    pytest.fail(f"{request.param}: no EOS bias made rows stop apart")


@pytest.mark.parametrize("decoder", FAMILY_DECODERS)
def test_every_decoder_gives_generate_tokens(family, decoder):
    name, model, ids, mask, _ = family
    # one EOS id, or a list (a row finishes on any of them), the families taking turns: each
    # setting is one more compile of the graph decoders' step, about 20 s on two CPU cores
    eos = [EOS, 7] if list(FAMILIES).index(name) % 2 else EOS
    ref = hf_generate(model, ids, mask, N, eos, PAD, **HF_REFERENCE[decoder])
    out = fg.generate(model, ids, mask, decoder=decoder, max_new_tokens=N, eos_token_id=eos,
                      pad_token_id=PAD)
    assert first_divergence(model, ids, mask, ref, out) is None, (name, decoder, eos)


def test_sampling_is_the_same_on_every_decoder(family):
    name, model, ids, mask, _ = family
    outs = {d: fg.generate(model, ids, mask, decoder=d, max_new_tokens=N, eos_token_id=EOS,
                           pad_token_id=PAD, do_sample=True, seed=3, temperature=0.8, top_k=20)
            for d in FAMILY_DECODERS}
    assert all(torch.equal(o, outs["naive"]) for o in outs.values()), name


def test_grouped_one_query_attention_matches_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    g = torch.Generator().manual_seed(0)
    for kv_heads in (1, 2, 4):  # multi-query, grouped-query, one key/value head per query head
        q = torch.randn(2, 4, 1, 8, generator=g)
        k, v = (torch.randn(2, kv_heads, 10, 8, generator=g) for _ in range(2))
        mask = torch.ones(2, 1, 1, 10, dtype=torch.bool)
        mask[0, ..., :4] = False  # a left-padded row
        mask[:, ..., 7:] = False  # cache slots not written yet
        layer = torch.nn.Module()
        layer.is_causal, layer.num_key_value_groups = True, 4 // kv_heads
        want, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.3)
        got, _ = grouped_one_query_attention(layer, q, k, v, mask, scaling=0.3)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("make, why", [
    (lambda: T.T5ForConditionalGeneration(T.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)), "t5: an encoder-decoder"),
    (lambda: T.CTRLLMHeadModel(T.CTRLConfig(
        vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, dff=64)), "ctrl: transformers does not support a static"),
])
def test_unsupported_models_are_refused_by_name(make, why):
    model = make().eval()
    ids, mask = fg.make_batch(1, 4, vocab_size=VOCAB, pad_token_id=PAD)
    with pytest.raises(ValueError, match=why):
        fg.generate(model, ids, mask, decoder="naive", max_new_tokens=2, eos_token_id=EOS,
                    pad_token_id=PAD)


def test_a_model_whose_attention_cannot_switch_keeps_its_own():
    # Bloom's attention is not transformers' AttentionInterface: decode_attention must not try
    # (transformers would log a warning at every step) and the model runs its own attention
    from fastgen_lib.steps import decode_attention
    model = FAMILIES["bloom"]().eval()
    saved = model.config._attn_implementation

    def refuse(*_):
        raise AssertionError("set_attn_implementation called on a model that cannot switch")
    model.set_attn_implementation = refuse
    with decode_attention(model, "one_query"):
        assert model.config._attn_implementation == saved


def test_a_step_torch_compile_cannot_compile_is_refused_by_name():
    # GPT-J's attention fails inside inductor (torch 2.13, transformers 5.17): the graph decoders
    # say so, naming the model type and the decoders that run it
    model = T.GPTJForCausalLM(T.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                           rotary_dim=8, n_positions=128, bos_token_id=1,
                                           eos_token_id=EOS)).eval()
    ids, mask = fg.make_batch(2, 5, vocab_size=VOCAB, seed=1, pad_token_id=PAD)
    out = fg.generate(model, ids, mask, decoder="static_cache", max_new_tokens=3, eos_token_id=EOS,
                      pad_token_id=PAD)
    assert out.shape == (2, 8)
    with pytest.raises(ValueError, match="gptj: torch.compile cannot compile .*naive, kv_cache"):
        fg.generate(model, ids, mask, decoder="compiled", max_new_tokens=3, eos_token_id=EOS,
                    pad_token_id=PAD)


def test_load_model_by_path_and_by_named_shape(tmp_path):
    # a local checkpoint directory (what a model id resolves to): its weights, or its config with
    # random weights; and the Llama-3.2-1B shape, counted on the meta device (no memory)
    torch.manual_seed(0)
    FAMILIES["llama"]().save_pretrained(tmp_path)
    model = fg.load_model(str(tmp_path), device="cpu")
    assert type(model).__name__ == "LlamaForCausalLM" and model.fastgen_weights.startswith("pretrained")
    assert fg.load_model(str(tmp_path), device="cpu", weights="random").fastgen_weights == "random"
    ids, mask = fg.make_batch(2, 5, vocab_size=VOCAB, pad_token_id=PAD)
    ref = hf_generate(model, ids, mask, 4, EOS, PAD)
    out = fg.generate(model, ids, mask, decoder="interleaved", max_new_tokens=4, eos_token_id=EOS,
                      pad_token_id=PAD)
    assert first_divergence(model, ids, mask, ref, out) is None
    with pytest.raises(ValueError, match="no such folder"):
        fg.load_model(str(tmp_path / "missing"))
    from fastgen_lib.models import llama_1b_config
    with torch.device("meta"):
        shape = T.LlamaForCausalLM(llama_1b_config())
    assert sum(p.numel() for p in shape.parameters()) == 1_235_814_400  # Llama-3.2-1B's count
    assert fg.load_tokenizer("llama-1b") is None and fg.load_tokenizer("gpt2") is not None
