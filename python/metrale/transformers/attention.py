"""The attention and mask functions of ``attn_implementation="metrale"``, and the forward
context that hands them the cache: transformers calls ``cache.update(key, value, layer_idx)``
and then the registered attention function for the same layer; ``PagedCache.update`` only
makes the cache the forward's current one (a thread-local, the pattern of vLLM's
``get_forward_context``) and the attention function writes K/V into the pages and attends
(``PagedCache.attend``)."""

from __future__ import annotations

import inspect
import threading
from typing import Any, Optional, Tuple

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

ATTN_IMPLEMENTATION = "metrale"

_forward = threading.local()  # .cache: the PagedCache whose layer was updated last on this thread


def make_current(cache: Any) -> None:
    """Makes `cache` the one the next attention call on this thread attends over."""
    _forward.cache = cache


def cache_kwarg() -> str:
    """The keyword generate / forward take the cache by in the installed transformers: 'cache'
    from 5.24 on (``past_key_values`` deprecated), 'past_key_values' before. PagedCache serves
    both; ``model.generate(**inputs, **{cache_kwarg(): cache})`` runs on either."""
    from transformers import GenerationMixin
    params = inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    return "cache" if "cache" in params else "past_key_values"


def metrale_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None,
                              dropout: float = 0.0, sliding_window: Optional[int] = None,
                              softcap: Optional[float] = None, s_aux: Optional[torch.Tensor] = None,
                              **kwargs) -> Tuple[torch.Tensor, None]:
    """The attention function of ``attn_implementation="metrale"``: query (batch, q_heads, n,
    head_dim), key/value (batch, kv_heads, n, head_dim) of the new tokens (V's head_dim may be
    narrower); writes them into the current PagedCache and attends over it. Returns ((batch, n,
    q_heads, V's head_dim), None) in the query's dtype."""
    cache = getattr(_forward, "cache", None)
    _forward.cache = None  # consumed: each layer's update names the cache again
    layer = getattr(module, "layer_idx", None)
    if cache is not None and layer is not None:
        cache.consume(layer)
    if cache is None or layer is None or cache.last_updated_layer != layer:
        raise RuntimeError(f"attn_implementation 'metrale' needs {cache_kwarg()}=metrale.transformers.PagedCache(...) "
                           f"updated for this layer (module layer_idx = {layer!r}); pass one to generate/forward "
                           "(the keyword is 'cache' from transformers 5.24 on, 'past_key_values' before)")
    dtype = query.dtype
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"'query': dtype {dtype}; attn_implementation 'metrale' expects torch.bfloat16 (float16 "
                        "and float32 models run through it with q/K/V rounded to bfloat16)")
    if dtype != torch.bfloat16:  # the cache's rows and the kernels' queries are bfloat16
        query, key, value = query.to(torch.bfloat16), key.to(torch.bfloat16), value.to(torch.bfloat16)
    if dropout:
        raise ValueError(f"'dropout' = {dropout!r}; metrale attention is inference-only (expected 0)")
    if key.shape[2] != query.shape[2]:
        raise ValueError(f"'key': {key.shape[2]} tokens for {query.shape[2]} query tokens; expected the new "
                         "tokens' K/V as PagedCache.update returns them")
    window = int(sliding_window) if sliding_window else cache.windows[layer]
    sinks = None
    if s_aux is not None:
        sinks = s_aux.detach().to(torch.float32).contiguous()
    out = cache.attend(layer, query, key, value, attention_mask, scaling, window, float(softcap or 0.0), sinks)
    return (out if dtype == torch.bfloat16 else out.to(dtype)), None


def metrale_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function: Any = None, attention_mask: Optional[torch.Tensor] = None, **kwargs):
    """The mask function of ``"metrale"``: the 2-D padding mask (batch, kv_length) as given (None
    when there is none). Causality and windows are the kernels' (aligned to the end of the cache)."""
    if attention_mask is None:
        return None
    return attention_mask


def register(name: str = ATTN_IMPLEMENTATION) -> None:
    """Registers the attention and mask functions under `name` (done on import for "metrale")."""
    AttentionInterface.register(name, metrale_attention_forward)
    AttentionMaskInterface.register(name, metrale_mask)
