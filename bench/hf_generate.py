#!/usr/bin/env python3
"""A transformers model generating through metrale's paged cache, against SDPA and eager.

A Qwen3 model with random weights built from a config here (no download): by default a
Qwen3-8B-like attention shape (32 q / 8 kv heads, head_dim 128, q/k norms, RoPE, full and sliding
layers alternating), a left-padded batch of prompts of mixed lengths. It prints, per KV
format (bf16, fp8, nvfp4):

* the teacher-forced logit error against SDPA: the prompt and then the tokens SDPA
  generated are fed to both, and the max |logit - SDPA logit| over the batch, the
  vocabulary and every step (prefill's last position + each decode step) is reported,
  beside the same figure for eager attention (the spread of two correct implementations);
* whether greedy generation gives SDPA's tokens (and how many steps agree);
* the time per decode step (teacher-forced loop, synchronised per step) against SDPA's.

    python3 bench/hf_generate.py                      # the default shape, on CUDA when present
    python3 bench/hf_generate.py --layers 2 --hidden 256 --heads 4 --kv-heads 2 --head-dim 64 \\
        --prompt-lens 40,17,33 --new-tokens 6 --device cpu

tests/python/test_transformers.py calls the same functions on a small CPU model.
"""

from __future__ import annotations

import argparse
import time
from typing import Dict, List, Optional, Sequence

import torch


def cache_kwarg() -> str:
    """The keyword generate takes the cache by (metrale.transformers.cache_kwarg)."""
    from metrale.transformers import cache_kwarg as kwarg
    return kwarg()


def build_model(*, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, sliding_window: int,
                vocab: int = 1024, intermediate: Optional[int] = None, init_range: float = 0.02, seed: int = 0,
                device: str = "cpu"):
    """A Qwen3ForCausalLM in bfloat16 with random weights; layers alternate full / sliding when
    sliding_window > 0."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    types = ["full_attention" if (i % 2 == 0 or not sliding_window) else "sliding_attention" for i in range(layers)]
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=head_dim, max_position_embeddings=8192, sliding_window=sliding_window or None,
                      use_sliding_window=bool(sliding_window), layer_types=types, tie_word_embeddings=False,
                      initializer_range=init_range)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(dtype=torch.bfloat16, device=device).eval()
    return model


def make_prompts(lens: Sequence[int], vocab: int, seed: int = 1, device: str = "cpu"):
    """Left-padded random prompts: (input_ids, attention_mask), pad id 0."""
    g = torch.Generator().manual_seed(seed)
    width = max(lens)
    ids = torch.zeros((len(lens), width), dtype=torch.long)
    mask = torch.zeros((len(lens), width), dtype=torch.long)
    for i, n in enumerate(lens):
        ids[i, width - n:] = torch.randint(1, vocab, (n,), generator=g)
        mask[i, width - n:] = 1
    return ids.to(device), mask.to(device)


def _set_impl(model, impl: str) -> None:
    if impl == "metrale":
        import metrale.transformers  # noqa: F401 (registers "metrale")
    model.set_attn_implementation(impl)


def _new_cache(model, impl: str, fmt: Optional[str], batch: int, max_len: int, block_size: int):
    if impl == "metrale":
        import metrale.transformers as mt
        # "nvfp4-adaptive": an NVFP4 cache whose writes take the adaptive group scales
        fmt, _, rule = fmt.partition("-")
        return mt.PagedCache(model.config, fmt, max_batch_size=batch, max_cache_len=max_len, block_size=block_size,
                             nvfp4_scales=rule or "max6")
    from transformers import DynamicCache
    return DynamicCache(config=model.config)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def generate(model, ids, mask, new_tokens: int, impl: str, fmt: Optional[str] = None, block_size: int = 16):
    """Greedy generation: (sequences (batch, width + new_tokens), logits (new_tokens, batch, vocab) float32)."""
    _set_impl(model, impl)
    cache = _new_cache(model, impl, fmt, ids.shape[0], ids.shape[1] + new_tokens, block_size)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0,
                         **{cache_kwarg(): cache})
    return out.sequences, torch.stack([x.float() for x in out.logits])


@torch.no_grad()
def teacher_forced(model, ids, mask, tokens, impl: str, fmt: Optional[str] = None, block_size: int = 16):
    """Feeds the prompt, then tokens (batch, T) one per step. Returns (logits (T + 1, batch, vocab)
    float32: the prompt's last position, then each step; seconds per decode step)."""
    _set_impl(model, impl)
    batch, width = ids.shape
    steps = tokens.shape[1]
    cache = _new_cache(model, impl, fmt, batch, width + steps + 1, block_size)
    kw = {cache_kwarg(): cache}
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kw)
    logits = [out.logits[:, -1].float()]
    last = pos[:, -1:]
    times = []
    for t in range(steps):
        mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
        last = last + 1
        _sync(ids.device)
        t0 = time.perf_counter()
        out = model(input_ids=tokens[:, t:t + 1], attention_mask=mask, position_ids=last, use_cache=True, **kw)
        _sync(ids.device)
        times.append(time.perf_counter() - t0)
        logits.append(out.logits[:, -1].float())
    per_step = sorted(times[1:] or times)[len(times[1:] or times) // 2] if times else 0.0  # median, first skipped
    return torch.stack(logits), per_step


def token_agreement(gen, tokens, ref) -> dict:
    """Greedy tokens `gen` (batch, T) against SDPA's `tokens`: leading steps where every sequence
    agrees, SDPA's top-2 logit gap where they first differ (a tie within the logit error explains
    it), the sequences whose T tokens all equal SDPA's, and the mean per-sequence agreeing prefix."""
    same = gen == tokens
    steps = tokens.shape[1]
    agree = int(same.all(dim=0).long().cumprod(0).sum())
    margin = None
    if agree < steps:
        top2 = ref[agree].topk(2, dim=-1).values
        margin = float((top2[:, 0] - top2[:, 1])[~same[:, agree]].max())
    prefix = same.long().cumprod(1).sum(1).float()
    return {"tokens_equal_steps": agree, "first_mismatch_margin": margin,
            "seqs_identical": int((prefix == steps).sum()), "mean_prefix": float(prefix.mean())}


def compare(model, ids, mask, new_tokens: int, formats: Sequence[str] = ("bf16", "fp8", "nvfp4", "nvfp4-adaptive"),
            block_size: int = 16, eager: bool = True) -> Dict[str, dict]:
    """Every figure of the report, as a dict per implementation ('sdpa', 'eager', 'metrale-<fmt>')."""
    width = ids.shape[1]
    seq, _ = generate(model, ids, mask, new_tokens, "sdpa")
    tokens = seq[:, width:]
    ref, ref_step = teacher_forced(model, ids, mask, tokens, "sdpa")
    res: Dict[str, dict] = {"sdpa": {"max_err": 0.0, "step_s": ref_step, "logit_absmax": float(ref.abs().max())}}
    if eager:
        lg, st = teacher_forced(model, ids, mask, tokens, "eager")
        gseq, _ = generate(model, ids, mask, new_tokens, "eager")
        res["eager"] = {"max_err": float((lg - ref).abs().max()), "mean_err": float((lg - ref).abs().mean()),
                        "step_s": st, **token_agreement(gseq[:, width:], tokens, ref)}
    for fmt in formats:
        lg, st = teacher_forced(model, ids, mask, tokens, "metrale", fmt, block_size)
        gseq, _ = generate(model, ids, mask, new_tokens, "metrale", fmt, block_size)
        res[f"metrale-{fmt}"] = {"max_err": float((lg - ref).abs().max()),
                                 "mean_err": float((lg - ref).abs().mean()), "step_s": st,
                                 **token_agreement(gseq[:, width:], tokens, ref),
                                 "finite": bool(torch.isfinite(lg).all())}
    return res


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=0, help="MLP width (0: 2 x hidden)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--sliding-window", type=int, default=512, help="window of the odd layers (0: all full)")
    ap.add_argument("--prompt-lens", default="64,2048,300,1024,130,777,1500,512")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--formats", default="bf16,fp8,nvfp4,nvfp4-adaptive",
                    help="comma list of bf16, fp8, nvfp4, nvfp4-adaptive (NVFP4 with adaptive group scales)")
    ap.add_argument("--no-eager", action="store_true", help="skip the eager baseline (its memory is O(L^2))")
    a = ap.parse_args(argv)
    lens = [int(x) for x in a.prompt_lens.split(",")]
    model = build_model(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim,
                        sliding_window=a.sliding_window, vocab=a.vocab, intermediate=a.intermediate or None,
                        device=a.device)
    ids, mask = make_prompts(lens, a.vocab, device=a.device)
    print(f"model: Qwen3 {a.layers} layers, hidden {a.hidden}, {a.heads}/{a.kv_heads} heads, d{a.head_dim}, "
          f"sliding window {a.sliding_window} on odd layers; device {a.device}; batch {len(lens)} left-padded "
          f"prompts {lens}; {a.new_tokens} new tokens; page {a.block_size}")
    res = compare(model, ids, mask, a.new_tokens, a.formats.split(","), a.block_size, eager=not a.no_eager)
    sdpa = res["sdpa"]["step_s"]
    print(f"SDPA logits: max |logit| {res['sdpa']['logit_absmax']:.3f}")
    print("tokens: leading steps all sequences agree with SDPA (SDPA's top-2 gap there); sequences "
          "identical to SDPA's; mean agreeing prefix per sequence")
    print(f"{'implementation':<16} {'max|dlogit|':>12} {'mean|dlogit|':>13} {'tokens=':>16} {'seqs=':>6} "
          f"{'prefix':>7} {'ms/step':>9} {'vs SDPA':>8}")
    for name, r in res.items():
        mean = f"{r['mean_err']:.5f}" if "mean_err" in r else "-"
        agree = f"{r['tokens_equal_steps']}/{a.new_tokens}" if "tokens_equal_steps" in r else "-"
        if r.get("first_mismatch_margin") is not None:
            agree += f" (gap {r['first_mismatch_margin']:.3f})"
        seqs = f"{r['seqs_identical']}/{len(lens)}" if "seqs_identical" in r else "-"
        prefix = f"{r['mean_prefix']:.1f}" if "mean_prefix" in r else "-"
        ratio = r["step_s"] / sdpa if sdpa else float("nan")
        print(f"{name:<16} {r['max_err']:>12.5f} {mean:>13} {agree:>16} {seqs:>6} {prefix:>7} "
              f"{1e3 * r['step_s']:>9.3f} {ratio:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
