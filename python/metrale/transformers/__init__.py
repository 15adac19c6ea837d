"""Hugging Face transformers (5.x) integration: a paged metrale cache and an attention function.

    import metrale.transformers as mt            # registers attn_implementation "metrale"
    model.set_attn_implementation("metrale")     # or from_pretrained(..., attn_implementation="metrale")
    cache = mt.PagedCache(model.config, format="nvfp4", max_batch_size=8, max_cache_len=4096)
    out = model.generate(**inputs, cache=cache, max_new_tokens=64)   # past_key_values= before 5.24

How it plugs in. transformers calls ``cache.update(key, value, layer_idx)`` and then the
registered attention function for the same layer. ``PagedCache.update`` only makes the
cache the forward's current one (a thread-local forward context, the pattern of vLLM's
``get_forward_context``) and returns K and V unchanged; the attention function writes them
into the paged cache (``reshape_and_cache``, the only copy of K/V) and attends over it:
``torch.ops.metrale.attention``: a prefill (or any step of more than one token) as query
runs (causal, aligned to the end of the cache; at batch 1 the query is read as the
head-strided view transformers hands, without a copy), a one-token decode step as one row
per sequence. The mask function registered under the same name hands the 2-D
padding mask through unchanged (without one, transformers would pass no mask and left
padding would be lost).

What the cache does:

* **Blocks**: ``num_blocks`` pages of ``block_size`` tokens per layer (K and V each), handed
  out on demand by ``metrale.BlockAllocator`` (reference-counted; the C++ allocator of the
  ``metrale`` command's serve-sim); every layer of a sequence uses the same block ids.
* **Left padding**: padding columns of the prompt are not written (slot -1) and are not part
  of the sequence: sequence i holds only its real tokens, so causal alignment and windows
  are over real positions, as in the padded model's mask.
* **Sliding windows**: per layer from ``config.layer_types`` / ``config.sliding_window``
  (or the ``sliding_window`` the model passes); the window is applied by the kernels, the
  pages stay allocated.
* **Geometry**: kv heads and head dims from the model's first K/V; rows narrower than a
  supported head_dim (64, 128, 256), or V narrower than K, are held zero-padded to the next
  one (the queries too; the output comes back at V's width).
* **Bypass check**: a layer whose attention did not run through ``"metrale"`` (another
  implementation, or a model that does not use transformers' AttentionInterface) makes the
  next ``update`` raise, since the cache returns only the new tokens' K/V.
* **Calibration**: FP8 / NVFP4 scales of each layer from the absmax of the first K/V it is
  given (the prompt's real tokens), before that write; fixed afterwards.
* **Assisted generation** (speculative decoding with an assistant model or prompt lookup,
  batch 1 in transformers): the model verifies the draft tokens as one query run over the
  cache, and ``crop`` gives back the rejected ones.
* **Beam search**: ``reorder_cache`` lets each beam go on from the history it chose; the
  histories' full blocks are shared by reference count (never written again), a shared
  partial last block is copied, and blocks no beam kept go back to the free list.
  ``batch_repeat_interleave`` and ``batch_select_indices`` remap the batch the same way.

Limits: one batch per cache (``reset()`` to reuse it; ``num_return_sequences`` and
``num_beams`` expand the prompts before the prefill: ``max_batch_size`` counts the copies);
attention runs in bfloat16 (a float16 / float32 model's q, K, V are rounded to it, the output
cast back); the tokens of a decode step are never padding (what ``generate`` does).
Continuous batching (``generate_batch``) builds its own ``PagedAttentionCache`` internally
and is not served (docs/engines.md).
"""

from __future__ import annotations

try:
    import transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without transformers
    raise ImportError(f"metrale.transformers needs transformers >= 5 (import failed: {e})") from e

from .attention import ATTN_IMPLEMENTATION, cache_kwarg, metrale_attention_forward, metrale_mask, register
from .cache import PagedCache

register()

__all__ = ["PagedCache", "metrale_attention_forward", "metrale_mask", "register", "cache_kwarg",
           "ATTN_IMPLEMENTATION"]
