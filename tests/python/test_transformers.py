"""metrale.transformers: a small Qwen3 model (random weights, 2 layers: one full, one sliding
window of 24; hidden 256, 4 q / 2 kv heads, head_dim 64, pages of 16) generating greedily
on CPU through attn_implementation "metrale" and a PagedCache, against the same model with
SDPA, on a left-padded batch (bench/hf_generate.py computes the figures).

Tolerances (max |logit - SDPA logit| over batch, vocabulary and 9 teacher-forced steps;
SDPA's logits reach about 1.3; measured over seeds): BF16 0.009-0.012 while eager attention
is 0.010-0.013 from SDPA: BF16 must be within 1.5x eager's distance; FP8 0.05-0.056:
<= 0.1 x max|logit|; NVFP4 0.18-0.21: <= 0.3 x max|logit|. BF16's greedy tokens must equal
SDPA's up to the first step whose SDPA top-2 gap is within twice the measured error (a tie);
the quantised formats' token agreement is reported, not asserted.
Passes with transformers 5.17.0 and 5.24.0. Skipped without torch / transformers."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import metrale  # noqa: E402
import metrale.transformers as mt  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import hf_generate as hg  # noqa: E402

PROMPTS = [40, 17, 33, 29]  # left-padded to 40; the window (24) is shorter than the longest
NEW = 8


@pytest.fixture(scope="module")
def model():
    return hg.build_model(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, sliding_window=24, vocab=512,
                          seed=0)


@pytest.fixture(scope="module")
def prompts(model):
    return hg.make_prompts(PROMPTS, model.config.vocab_size, seed=0)


@pytest.fixture(scope="module")
def report(model, prompts):
    ids, mask = prompts
    r = hg.compare(model, ids, mask, NEW)
    for name, v in r.items():
        print(name, v)
    return r


def _tokens_ok(r):
    return r["tokens_equal_steps"] == NEW or r["first_mismatch_margin"] <= 2 * r["max_err"]


def test_bf16_as_close_to_sdpa_as_eager(report):
    r, eager = report["metrale-bf16"], report["eager"]["max_err"]
    assert r["finite"]
    assert r["max_err"] <= 1.5 * eager, (r["max_err"], eager)
    assert _tokens_ok(r), r


@pytest.mark.parametrize("fmt,bound", [("fp8", 0.1), ("nvfp4", 0.3), ("nvfp4-adaptive", 0.3)])
def test_quantised_caches_have_bounded_logit_error(report, fmt, bound):
    r = report[f"metrale-{fmt}"]
    assert r["finite"]
    assert r["max_err"] <= bound * report["sdpa"]["logit_absmax"], r
    assert r["mean_err"] <= bound * report["sdpa"]["logit_absmax"] / 4, r


def test_nvfp4_scale_rule_is_the_caches(model):
    cache = mt.PagedCache(model.config, "nvfp4", max_batch_size=1, max_cache_len=32, nvfp4_scales="adaptive")
    assert cache.nvfp4_scales == "adaptive"
    with pytest.raises(ValueError, match="nvfp4_scales"):
        mt.PagedCache(model.config, "fp8", max_batch_size=1, max_cache_len=32, nvfp4_scales="adaptive")


def test_cache_pages_hold_only_real_tokens(model, prompts):
    ids, mask = prompts
    model.set_attn_implementation("metrale")
    cache = mt.PagedCache(model.config, "fp8", max_batch_size=4, max_cache_len=64, num_blocks=40)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True,
              **{hg.cache_kwarg(): cache})
    assert cache.get_seq_length() == ids.shape[1]          # transformers' columns, padding included
    assert list(cache.seq_lens) == PROMPTS                    # metrale's lengths: real tokens only
    used = sum(-(-n // 16) for n in PROMPTS)
    assert cache.allocator.num_free == 40 - used                   # blocks for real tokens only
    assert cache.is_sliding == [False, True]
    assert cache.windows == [0, 24]
    s = cache.kv.scales(0)                                 # calibrated from the prompt
    assert s["k_scale"] != 1.0 and s["v_scale"] != 1.0
    assert cache.saturated() == (0, 0)                     # the prompt lies within its own range
    # A decode step's K past layer 0's range (its scale shrunk 1000x) is clipped and counted.
    cache.kv.set_scales(0, k_scale=s["k_scale"] / 1000, v_scale=s["v_scale"], force=True)
    step_mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
    with torch.no_grad():
        model(input_ids=ids[:, -1:], attention_mask=step_mask, position_ids=(step_mask.cumsum(-1) - 1)[:, -1:],
              use_cache=True, **{hg.cache_kwarg(): cache})
    k_clipped, v_clipped = cache.saturated(0)
    assert k_clipped > 0 and v_clipped == 0
    cache.reset()
    assert cache.get_seq_length() == 0 and cache.allocator.num_free == 40


def test_generate_accepts_the_issue_call(model, prompts):
    """model.generate(..., past_key_values=PagedCache(config, format="nvfp4", ...)) on a model set to 'metrale'."""
    ids, mask = prompts
    model.set_attn_implementation("metrale")
    cache = mt.PagedCache(model.config, format="nvfp4", max_batch_size=4, max_cache_len=64)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0,
                         **{hg.cache_kwarg(): cache})
    assert out.shape == (4, ids.shape[1] + 3)
    assert list(cache.seq_lens) == [n + 2 for n in PROMPTS]  # the last token is sampled, not fed back


def _forward(model, cache, ids, mask):
    """One forward of `ids` (the last columns of `mask`) through the cache: its logits."""
    n = ids.shape[1]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, -n:]
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                     **{hg.cache_kwarg(): cache}).logits.float()


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_crop_rolls_back_draft_tokens(model, prompts, fmt):
    """Verify 4 draft tokens in one forward, crop the 3 rejected ones, go on: the same state and
    logits as a cache that only ever saw the accepted one (assisted generation's pattern)."""
    ids, mask = prompts
    model.set_attn_implementation("metrale")
    drafts = torch.randint(1, model.config.vocab_size, (ids.shape[0], 4), generator=torch.Generator().manual_seed(3))
    nxt = torch.randint(1, model.config.vocab_size, (ids.shape[0], 1), generator=torch.Generator().manual_seed(4))
    ones = mask.new_ones((mask.shape[0], 1))

    def run(first):  # prefill, then `first` draft tokens in one forward, then (after a crop) one more
        cache = mt.PagedCache(model.config, fmt, max_batch_size=4, max_cache_len=64, num_blocks=40)
        _forward(model, cache, ids, mask)
        m = torch.cat([mask] + [ones] * first, dim=1)
        _forward(model, cache, drafts[:, :first], m)
        return cache, m

    rolled, m = run(4)
    rolled.crop(torch.tensor(-3) if fmt == "nvfp4" else -3)  # transformers 5.17 passes a 0-d tensor
    kept, _ = run(1)
    m = m[:, :-3]
    assert list(rolled.seq_lens) == list(kept.seq_lens) == [n + 1 for n in PROMPTS]
    assert rolled.get_seq_length() == kept.get_seq_length() == ids.shape[1] + 1
    assert rolled.allocator.num_free == kept.allocator.num_free  # the rejected tokens' pages are back
    step = torch.cat([m, ones], dim=1)
    got, want = _forward(model, rolled, nxt, step), _forward(model, kept, nxt, step)
    err = float((got - want).abs().max())
    assert err <= 2e-2 * float(want.abs().max()), err  # the drafts' K/V rows are recomputed, not reused
    # Without the crop, the rejected drafts would be attended: far from the accepted-only logits.
    stale, m4 = run(4)
    far = float((_forward(model, stale, nxt, torch.cat([m4, ones], dim=1)) - want).abs().max())
    assert far > 10 * err, (far, err)
    # The legacy positive form keeps that many columns; more than the shortest sequence cannot go.
    before = rolled.get_seq_length()
    rolled.crop(before - 1)
    assert rolled.get_seq_length() == before - 1 and list(rolled.seq_lens) == [n + 1 for n in PROMPTS]
    rolled.crop(before + 5)  # not shorter: nothing
    assert rolled.get_seq_length() == before - 1
    with pytest.raises(ValueError, match="shortest"):
        rolled.crop(-(min(PROMPTS) + 2))
    with pytest.raises(TypeError, match="tokens_to_remove"):
        rolled.crop(1.5)


def _prompt_lookup(model, fmt, device="cpu"):
    """generate(prompt_lookup_num_tokens=3) on a metrale cache, with the crops it made."""
    base = torch.randint(1, model.config.vocab_size, (7,), generator=torch.Generator().manual_seed(5))
    ids = base.repeat(5).unsqueeze(0).to(device)  # periodic: the lookup finds its last n-gram earlier
    mask = torch.ones_like(ids)
    removed = []
    cache = mt.PagedCache(model.config, fmt, max_batch_size=1, max_cache_len=96)
    crop = cache.crop
    cache.crop = lambda t: (removed.append(int(t)), crop(t))[1]
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                         prompt_lookup_num_tokens=3, **{hg.cache_kwarg(): cache})
    assert out.shape[1] == ids.shape[1] + 12
    assert any(t < 0 for t in removed), removed  # drafts were proposed and some rejected
    assert int(cache.seq_lens[0]) == out.shape[1] - 1 == cache.get_seq_length()
    plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=1, do_sample=False, pad_token_id=0,
                           **{hg.cache_kwarg(): mt.PagedCache(model.config, fmt, max_batch_size=1,
                                                              max_cache_len=96)})
    assert int(out[0, ids.shape[1]]) == int(plain[0, ids.shape[1]])


def test_prompt_lookup_generation_verifies_and_crops(model):
    """generate(prompt_lookup_num_tokens=3) on a metrale cache: the model verifies the looked-up
    draft tokens as one query run and crops the rejected ones; every kept token is one of the
    sequence's (cache length = output length - 1) and the first new token is plain greedy's."""
    model.set_attn_implementation("metrale")
    _prompt_lookup(model, "bf16")


def test_num_return_sequences_expands_the_prompts(model, prompts):
    """generate(num_return_sequences=2, do_sample=True): the prompts are expanded before the
    prefill, so the cache holds both copies of each prompt, and each copy then samples its own."""
    ids, mask = prompts
    model.set_attn_implementation("metrale")
    cache = mt.PagedCache(model.config, "fp8", max_batch_size=8, max_cache_len=64)
    torch.manual_seed(0)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=True, num_return_sequences=2,
                         pad_token_id=0, **{hg.cache_kwarg(): cache})
    assert out.shape == (8, ids.shape[1] + 4)
    assert list(cache.seq_lens) == [n + 3 for n in PROMPTS for _ in range(2)]


def _refs_match_tables(cache):
    """Every block's reference count is the number of sequences whose length reaches it."""
    want = {}
    table, lens = cache.block_table, cache.seq_lens
    for b in range(cache.batch_size):
        for j in range(-(-int(lens[b]) // cache.block_size)):
            want[int(table[b, j])] = want.get(int(table[b, j]), 0) + 1
    held = {i: cache.allocator.ref_count(i) for i in range(cache.num_blocks) if cache.allocator.ref_count(i)}
    return held == want and cache.allocator.num_free == cache.num_blocks - len(want)


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_reorder_cache_continues_the_chosen_histories(model, prompts, fmt):
    """reorder_cache (beam search): after a step, sequences continue others' histories (shared
    blocks, the partial last one copied); the next step's logits equal those of a cache that
    prefilled the chosen prompts and steps, and a crop after the reorder keeps the counts."""
    ids, mask = prompts
    model.set_attn_implementation("metrale")
    g = torch.Generator().manual_seed(6)
    t = torch.randint(1, model.config.vocab_size, (4, 1), generator=g)
    u = torch.randint(1, model.config.vocab_size, (4, 1), generator=g)
    ones = mask.new_ones((4, 1))
    idx = torch.tensor([1, 1, 3, 0])

    beams = mt.PagedCache(model.config, fmt, max_batch_size=4, max_cache_len=64, num_blocks=40)
    _forward(model, beams, ids, mask)
    _forward(model, beams, t, torch.cat([mask, ones], 1))
    beams.reorder_cache(idx)
    assert _refs_match_tables(beams)
    assert beams.allocator.ref_count(int(beams.block_table[0, 0])) == 2  # sequences 0 and 1 share the first block of prompt 1
    step = torch.cat([mask[idx], ones, ones], 1)
    got = _forward(model, beams, u, step)

    fresh = mt.PagedCache(model.config, fmt, max_batch_size=4, max_cache_len=64, num_blocks=40)
    for layer in range(len(fresh.windows)):  # with the first batch's scales (calibrated from all four prompts)
        fresh.set_scales(layer, **beams.kv.scales(layer))
    _forward(model, fresh, ids[idx], mask[idx])
    _forward(model, fresh, t[idx], torch.cat([mask[idx], ones], 1))
    want = _forward(model, fresh, u, step)
    err = float((got - want).abs().max())
    assert err <= 2e-2 * float(want.abs().max()), err
    assert list(beams.seq_lens) == list(fresh.seq_lens)
    beams.crop(-2)
    assert _refs_match_tables(beams) and list(beams.seq_lens) == [PROMPTS[i] for i in idx.tolist()]
    with pytest.raises(ValueError, match="beam_idx"):
        beams.reorder_cache(torch.tensor([0, 1, 4, 0]))


def test_repeat_and_select_remap_the_batch(model, prompts):
    """batch_repeat_interleave(2) after a step, then batch_select_indices: each copy continues
    its original (the same next logits), and the kept rows continue theirs; counts consistent."""
    ids, mask = prompts
    model.set_attn_implementation("metrale")
    g = torch.Generator().manual_seed(7)
    t, u, w = (torch.randint(1, model.config.vocab_size, (4, 1), generator=g) for _ in range(3))
    ones = mask.new_ones((4, 1))
    cache = mt.PagedCache(model.config, "bf16", max_batch_size=8, max_cache_len=64)
    _forward(model, cache, ids, mask)
    _forward(model, cache, t, torch.cat([mask, ones], 1))
    ref = mt.PagedCache(model.config, "bf16", max_batch_size=8, max_cache_len=64)
    _forward(model, ref, ids, mask)
    _forward(model, ref, t, torch.cat([mask, ones], 1))
    want = _forward(model, ref, u, torch.cat([mask, ones, ones], 1))
    cache.batch_repeat_interleave(2)
    assert cache.batch_size == 8 and _refs_match_tables(cache)
    m8 = torch.cat([mask, ones, ones], 1).repeat_interleave(2, 0)
    got = _forward(model, cache, u.repeat_interleave(2, 0), m8)
    assert float((got - want.repeat_interleave(2, 0)).abs().max()) <= 2e-2 * float(want.abs().max())
    cache.batch_select_indices(torch.tensor([6, 1]))  # copies of sequences 3 and 0
    assert cache.batch_size == 2 and _refs_match_tables(cache)
    assert list(cache.seq_lens) == [PROMPTS[3] + 2, PROMPTS[0] + 2]
    keep = torch.tensor([3, 0])
    ref.batch_select_indices(keep)
    m2 = torch.cat([mask[keep], ones[:2], ones[:2], ones[:2]], 1)
    got2, want2 = _forward(model, cache, w[:2], m2), _forward(model, ref, w[:2], m2)
    assert float((got2 - want2).abs().max()) <= 2e-2 * float(want2.abs().max())
    with pytest.raises(ValueError, match="max_batch_size"):
        cache.batch_repeat_interleave(5)
    with pytest.raises(ValueError, match="repeats"):
        cache.batch_repeat_interleave(0)


def test_beam_search_generates_through_the_cache(model, prompts):
    """generate(num_beams=3): every step reorders the cache; the outputs are SDPA's beams' shape,
    the block counts stay consistent, and the best beam's first token is SDPA's up to a tie."""
    ids, mask = prompts
    model.set_attn_implementation("metrale")
    cache = mt.PagedCache(model.config, "bf16", max_batch_size=12, max_cache_len=64)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, num_beams=3, do_sample=False,
                         pad_token_id=0, **{hg.cache_kwarg(): cache})
    assert out.shape[0] == 4 and ids.shape[1] < out.shape[1] <= ids.shape[1] + 5
    assert _refs_match_tables(cache)


_FAMILY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=0, eos_token_id=1, bos_token_id=2)
FAMILIES = {  # what each adds: GQA; a sliding window; soft-cap + windows + d128; sinks + windows; rows of
    # 96 (padded to 128); a config without num_key_value_heads (the cache takes the model's K: 4 heads)
    "Llama": dict(_FAMILY, head_dim=64),
    "Mistral": dict(_FAMILY, head_dim=64, sliding_window=24),
    "Gemma2": dict(_FAMILY, head_dim=128, sliding_window=24, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, query_pre_attn_scalar=128),
    # one expert: routing flips between experts would amplify the formats' error (fp8 0.33 with
    # 4 experts against 0.03 with one), which is the router's, not the attention's
    "GptOss": dict(_FAMILY, head_dim=64, num_local_experts=1, num_experts_per_tok=1, sliding_window=24,
                   intermediate_size=128),
    "Phi3": dict(_FAMILY, hidden_size=384),
    "GPTNeoX": dict(_FAMILY),
}


# The CPU backend everywhere; the GPU kernels where metrale can use the device.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and metrale.cuda_available()), reason="no CUDA device usable by metrale (sm_90)"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_families_match_eager(prompts, family, device):
    """Other architectures through the same integration, teacher-forced against eager attention
    (the reference these families have in transformers): BF16 within 0.03 of logits up to ~1.5
    (measured 0.008-0.017 on the CPU; eager vs SDPA is 0.008-0.012 where SDPA exists), NVFP4
    within 0.3x."""
    import transformers as tf
    if not hasattr(tf, family + "Config"):
        pytest.skip(f"{family} is not in this transformers")
    torch.manual_seed(0)
    m = getattr(tf, family + "ForCausalLM")(getattr(tf, family + "Config")(**FAMILIES[family]))
    m = m.to(torch.bfloat16).eval().to(device)
    ids, mask = (t.to(device) for t in prompts)
    cont = torch.randint(3, 512, (ids.shape[0], 6), generator=torch.Generator().manual_seed(1)).to(device)
    ref = hg.teacher_forced(m, ids, mask, cont, "eager")[0]
    got = hg.teacher_forced(m, ids, mask, cont, "metrale", "bf16")[0]
    assert float((got - ref).abs().max()) <= 0.03, float((got - ref).abs().max())
    q = hg.teacher_forced(m, ids, mask, cont, "metrale", "nvfp4")[0]
    assert torch.isfinite(q).all() and float((q - ref).abs().max()) <= 0.3 * float(ref.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_float32_and_float16_models_attend_in_bfloat16(prompts, dtype):
    """A model kept in float32 or float16 runs through the integration with q/K/V rounded to
    bfloat16 and its output cast back: within 0.03 of its own eager attention (as BF16 is)."""
    import transformers as tf
    torch.manual_seed(0)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**FAMILIES["Llama"])).to(dtype).eval()
    ids, mask = prompts
    cont = torch.randint(3, 512, (ids.shape[0], 6), generator=torch.Generator().manual_seed(1))
    ref = hg.teacher_forced(m, ids, mask, cont, "eager")[0]
    got = hg.teacher_forced(m, ids, mask, cont, "metrale", "bf16")[0]
    assert float((got - ref).abs().max()) <= 0.03, float((got - ref).abs().max())


@pytest.mark.parametrize("device", DEVICES)
def test_gpt_oss_at_batch_one(device):
    """A GPT-OSS-shaped model (sinks, head_dim 64, sliding layers) at batch 1: transformers hands
    q as (1, heads, tokens, head_dim), read as (tokens, heads, head_dim) rows whose heads are
    strided; the prompt teacher-forced against eager, then assisted generation (the drafts as
    query runs of the same view)."""
    import transformers as tf
    if not hasattr(tf, "GptOssConfig"):
        pytest.skip("GptOss is not in this transformers")
    torch.manual_seed(0)
    m = tf.GptOssForCausalLM(tf.GptOssConfig(**FAMILIES["GptOss"])).to(torch.bfloat16).eval().to(device)
    ids, mask = hg.make_prompts([29], 512, device=device)
    cont = torch.randint(3, 512, (1, 3), generator=torch.Generator().manual_seed(2)).to(device)
    ref = hg.teacher_forced(m, ids, mask, cont, "eager")[0]
    got = hg.teacher_forced(m, ids, mask, cont, "metrale", "bf16")[0]
    assert float((got - ref).abs().max()) <= 0.03, float((got - ref).abs().max())
    m.set_attn_implementation("metrale")
    _prompt_lookup(m, "bf16", device)


def _causal_reference(q, k, v, scale):
    """float64 causal attention of (batch, heads, n, d) q over (batch, kv_heads, n, dv) k/v, the
    last query row at the last position (GQA: q head h reads kv head h // group)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    n, m = q.shape[2], k.shape[2]
    s = s.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(m - n + 1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2)  # (batch, n, heads, dv)


@pytest.mark.parametrize("dk,dv", [(96, 64), (32, 32), (80, 80)])
def test_rows_narrower_than_a_supported_head_dim_are_padded(dk, dv):
    """Rows of 32, 80 or 96 elements, and V narrower than K (as a latent attention's), are held
    zero-padded to the next supported head_dim: a prompt of 9 tokens and two decode steps match
    float64 attention over the same bf16 values (within the bf16 output's rounding)."""
    from types import SimpleNamespace
    cfg = SimpleNamespace(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=dk,
                          hidden_size=4 * dk)
    cache = mt.PagedCache(cfg, "bf16", max_batch_size=2, max_cache_len=32, block_size=16)
    layer = SimpleNamespace(layer_idx=0)
    g = torch.Generator().manual_seed(dk + dv)
    ks, vs = [], []
    for n in (9, 1, 1):
        q = torch.randn(2, 4, n, dk, generator=g).bfloat16()
        k, v = torch.randn(2, 2, n, dk, generator=g).bfloat16(), torch.randn(2, 2, n, dv, generator=g).bfloat16()
        ks.append(k)
        vs.append(v)
        key, value = cache.update(k, v, 0)
        out, _ = mt.metrale_attention_forward(layer, q, key, value, None, scaling=dk ** -0.5)
        assert out.shape == (2, n, 4, dv)
        ref = _causal_reference(q, torch.cat(ks, 2), torch.cat(vs, 2), dk ** -0.5)
        assert float((out.double() - ref).abs().max()) <= 1e-2
    assert (cache.head_dim, cache.v_head_dim, cache.page_head_dim) == (dk, dv, 128 if max(dk, dv) > 64 else 64)


def test_per_layer_configs_build_a_cache_and_name_what_they_need():
    """A config whose head_dim and kv heads vary per layer (transformers' heterogeneous configs:
    Gemma 4's global layers) has no global value to read: the cache is still made, takes its
    geometry from the first K/V, and a layer of another geometry is refused by name."""
    import transformers as tf
    if not hasattr(tf, "Gemma4TextConfig"):
        pytest.skip("Gemma 4 is not in this transformers")
    from types import SimpleNamespace
    cfg = tf.Gemma4TextConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64, global_head_dim=128,
                              sliding_window=24, vocab_size_per_layer_input=512, hidden_size_per_layer_input=16)
    cache = mt.PagedCache(cfg, "bf16", max_batch_size=1, max_cache_len=32)
    assert cache.windows == [24, 24, 24, 24, 24, 0]
    x = torch.zeros(1, 2, 3, 64, dtype=torch.bfloat16)
    k, v = cache.update(x, x, 0)
    mt.metrale_attention_forward(SimpleNamespace(layer_idx=0), torch.zeros(1, 4, 3, 64, dtype=torch.bfloat16), k, v,
                                 None)
    wide = torch.zeros(1, 2, 3, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="layer 5.*one geometry"):
        cache.update(wide, wide, 5)


def test_attention_that_bypasses_the_cache_is_an_error(model, prompts):
    """A PagedCache under another attention implementation (or a model whose attention does not
    go through AttentionInterface) would attend over the new tokens only: the next layer's
    update says so instead."""
    ids, mask = prompts
    cache = mt.PagedCache(model.config, "bf16", max_batch_size=4, max_cache_len=64)
    model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad(), pytest.raises(RuntimeError, match="did not run through attn_implementation"):
            model(input_ids=ids, attention_mask=mask, use_cache=True, **{hg.cache_kwarg(): cache})
    finally:
        model.set_attn_implementation("metrale")


def test_errors_name_the_problem(model, prompts):
    ids, mask = prompts
    model.set_attn_implementation("metrale")
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="PagedCache"):
            model(input_ids=ids, attention_mask=mask, use_cache=False)
        right = mask.flip(1)  # right padding
        cache = mt.PagedCache(model.config, "bf16", max_batch_size=4, max_cache_len=64)
        with pytest.raises(ValueError, match="left-padded"):
            model(input_ids=ids, attention_mask=right, use_cache=True, **{hg.cache_kwarg(): cache})
        cache = mt.PagedCache(model.config, "bf16", max_batch_size=2, max_cache_len=64)
        with pytest.raises(ValueError, match="max_batch_size"):
            model(input_ids=ids, attention_mask=mask, use_cache=True, **{hg.cache_kwarg(): cache})
        cache = mt.PagedCache(model.config, "bf16", max_batch_size=4, max_cache_len=20)
        with pytest.raises(RuntimeError, match="max_cache_len"):
            model(input_ids=ids, attention_mask=mask, use_cache=True, **{hg.cache_kwarg(): cache})
        # Decode steps past max_cache_len (the prompt fits, with one token to spare) raise too,
        # also inside the last page (max_cache_len is not a multiple of the page).
        cache = mt.PagedCache(model.config, "bf16", max_batch_size=4, max_cache_len=max(PROMPTS) + 1)
        with pytest.raises(RuntimeError, match="max_cache_len"):
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                           **{hg.cache_kwarg(): cache})
    with pytest.raises(ValueError, match="max_cache_len"):
        mt.PagedCache(model.config, "bf16", max_batch_size=4, max_cache_len=0)
    bad = type(model.config)(**{**model.config.to_dict(), "layer_types": ["full_attention", "chunked_attention"]})
    with pytest.raises(ValueError, match="layer_types"):
        mt.PagedCache(bad, "bf16", max_batch_size=1, max_cache_len=8)


def test_a_forward_refused_leaves_the_cache_as_it_was(model, prompts):
    """A forward that metrale refuses before it writes (a batch past max_batch_size, a prompt
    past max_cache_len, no free block) gives back what it counted and took: the cache's length,
    its blocks and its batch are the last forward's, and the next generate runs as on a fresh
    cache."""
    ids, mask = prompts
    model.set_attn_implementation("metrale")
    kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    want = model.generate(input_ids=ids[:2], attention_mask=mask[:2], **kw,
                          **{hg.cache_kwarg(): mt.PagedCache(model.config, "bf16", max_batch_size=4,
                                                              max_cache_len=64)})
    blocks_per_seq = -(-(max(PROMPTS) + 3) // 16)
    for bad, cache in [
            ((ids, mask), mt.PagedCache(model.config, "bf16", max_batch_size=2, max_cache_len=64)),
            ((torch.cat([ids, ids], 1), torch.cat([mask, mask], 1)),
             mt.PagedCache(model.config, "bf16", max_batch_size=4, max_cache_len=64)),
            ((ids, mask), mt.PagedCache(model.config, "bf16", max_batch_size=4, max_cache_len=64,
                                        num_blocks=2 * blocks_per_seq + 1))]:
        with torch.no_grad(), pytest.raises((ValueError, RuntimeError)):
            model(input_ids=bad[0], attention_mask=bad[1], use_cache=True, **{hg.cache_kwarg(): cache})
        assert cache.get_seq_length() == 0 and cache.batch_size == -1
        assert cache.allocator.num_used == 0
        got = model.generate(input_ids=ids[:2], attention_mask=mask[:2], **kw, **{hg.cache_kwarg(): cache})
        assert torch.equal(got, want)


@pytest.mark.skipif(not (torch.cuda.is_available() and metrale.cuda_available()),
                    reason="no CUDA device usable by metrale (sm_90)")
def test_gpu_hf_generate_script_runs_quickly():
    """bench/hf_generate.py on the GPU with a reduced model (the lead runs the full shape)."""
    rc = hg.main(["--device", "cuda", "--layers", "2", "--hidden", "1024", "--prompt-lens", "64,300,129,17",
                  "--new-tokens", "4", "--vocab", "2048", "--sliding-window", "128"])
    assert rc == 0
    model = hg.build_model(layers=2, hidden=1024, heads=32, kv_heads=8, head_dim=128, sliding_window=128,
                           vocab=2048, device="cuda")
    ids, mask = hg.make_prompts([64, 300, 129, 17], 2048, device="cuda")
    r = hg.compare(model, ids, mask, 4, eager=True)
    assert r["metrale-bf16"]["max_err"] <= 1.5 * r["eager"]["max_err"] + 1e-3, r
    for fmt in ("fp8", "nvfp4"):
        assert r[f"metrale-{fmt}"]["finite"], r


@pytest.mark.skipif(not (torch.cuda.is_available() and metrale.cuda_available()),
                    reason="no CUDA device usable by metrale (sm_90)")
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
def test_gpu_assisted_and_beam_generation(fmt):
    """On the GPU: assisted generation (the drafts verified by the runs kernel, crops in
    between) and beam search (reorders copying shared partial blocks on the device)."""
    model = hg.build_model(layers=2, hidden=512, heads=16, kv_heads=4, head_dim=128, sliding_window=0, vocab=1024,
                           device="cuda")
    model.set_attn_implementation("metrale")
    _prompt_lookup(model, fmt, "cuda")
    ids, mask = hg.make_prompts([40, 17, 33], 1024, device="cuda")
    cache = mt.PagedCache(model.config, fmt, max_batch_size=6, max_cache_len=64)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, num_beams=2, do_sample=False,
                         pad_token_id=0, **{hg.cache_kwarg(): cache})
    assert out.shape[0] == 3 and _refs_match_tables(cache)
