"""PagedCache: a transformers ``Cache`` whose K/V live in a paged metrale cache, and the
write + attention of one layer's forward over it (``PagedCache.attend``)."""

from __future__ import annotations

import math
import operator
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from transformers.cache_utils import Cache, CacheLayerMixin

from .. import torch_ops  # noqa: F401 (registers torch.ops.metrale.*)
from .._arrays import SUPPORTED_HEAD_DIMS, format_name, make_layout
from .._metrale import KvFormat
from ..cache import PagedKVCache
from .attention import make_current
from .blocks import BlockTables


def _config_value(config: Any, name: str) -> Any:
    """config.<name>, or None where the config lacks it or keeps it per layer (reading it raises)."""
    try:
        return getattr(config, name, None)
    except Exception:  # transformers' AmbiguousGlobalPerLayerAttributeError, for one
        return None


def _layer_windows(config: Any, num_layers: int) -> List[int]:
    """Per-layer sliding window (0 = full attention) from config.layer_types / sliding_window."""
    window = _config_value(config, "sliding_window")
    types = _config_value(config, "layer_types")
    if types is None:
        return [int(window) if window else 0] * num_layers
    if len(types) < num_layers:
        raise ValueError(f"'config.layer_types' has {len(types)} entries; expected {num_layers} (num_hidden_layers)")
    out = []
    for i, t in enumerate(types[:num_layers]):
        if t == "full_attention":
            out.append(0)
        elif t == "sliding_attention":
            if not window:
                raise ValueError(f"'config.layer_types[{i}]' = 'sliding_attention' but config.sliding_window = "
                                 f"{window!r}; expected an int > 0")
            out.append(int(window))
        else:
            raise ValueError(f"'config.layer_types[{i}]' = {t!r}; metrale serves 'full_attention' and "
                             "'sliding_attention' layers")
    return out


def _page_head_dim(head_dim: int, what: str) -> int:
    """The head_dim of the pages that hold rows of `head_dim` elements: the smallest one the
    library supports that is at least as wide (the rows, and the queries, zero-padded to it)."""
    for d in SUPPORTED_HEAD_DIMS:
        if head_dim <= d:
            return d
    raise ValueError(f"{what} = {head_dim}; metrale's caches hold rows of up to {max(SUPPORTED_HEAD_DIMS)} "
                     f"elements (head_dim {', '.join(map(str, SUPPORTED_HEAD_DIMS))}; narrower rows are zero-padded)")


class _PagedLayer(CacheLayerMixin):
    """One layer's entry in ``Cache.layers`` (lengths, window); the pages live in the PagedCache."""

    is_compileable = False
    is_croppable = True  # through PagedCache.crop (every layer at once)
    supports_early_init = False

    def __init__(self, owner: "PagedCache", window: int):
        super().__init__()
        self._owner = owner
        self.sliding_window = window
        self.is_sliding = window > 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        raise RuntimeError("_PagedLayer.update: call PagedCache.update (the cache writes through the attention)")

    def get_mask_sizes(self, query_length: int, *args) -> Tuple[int, int]:
        return self._owner._columns + int(query_length), 0

    def get_seq_length(self) -> int:
        return self._owner._columns

    def get_max_length(self) -> int:
        return self._owner.max_cache_len

    def reset(self) -> None:
        self.is_initialized = False

    def reorder_cache(self, beam_idx) -> None:
        raise RuntimeError("_PagedLayer.reorder_cache: call PagedCache.reorder_cache (the layers share the pages)")

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("_PagedLayer.crop: call PagedCache.crop (the layers share the sequences' pages)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise RuntimeError("_PagedLayer.batch_repeat_interleave: call PagedCache.batch_repeat_interleave")

    def batch_select_indices(self, indices) -> None:
        raise RuntimeError("_PagedLayer.batch_select_indices: call PagedCache.batch_select_indices")


class PagedCache(Cache):
    """A transformers ``Cache`` whose K/V live in a paged metrale cache of one format.

    ``PagedCache(config, format="bf16", *, max_batch_size, max_cache_len, block_size=16,
    num_blocks=None, device=None)``: ``format`` "bf16", "fp8" or "nvfp4"; ``max_cache_len``
    the most real tokens one sequence holds (prompt + generated; assisted generation verifies
    drafts past ``max_new_tokens`` and needs up to ``prompt_lookup_num_tokens`` (or the
    assistant's draft length) more, which it crops afterwards); ``num_blocks`` pages per
    layer (default ``max_batch_size * ceil(max_cache_len / block_size)``: every sequence at
    full length); ``device`` where the pages are allocated (default: the device of the first
    K given). Use with a model whose ``attn_implementation`` is ``"metrale"``.

    The pages' geometry comes from the first K/V the model hands over (kv heads, K's and V's
    head_dim), not from the config (which some families spell differently); the config's is
    used only when ``set_scales`` allocates the pages before that. Rows narrower than a
    supported head_dim (64, 128, 256), and V narrower than K (multi-head latent attention),
    are stored zero-padded to the next one, and the queries padded alike: the scores and the
    output are unchanged, the pages cost the padded width.
    """

    def __init__(self, config: Any, format: str = "bf16", *, max_batch_size: int, max_cache_len: int,
                 block_size: int = 16, num_blocks: Optional[int] = None, device: Any = None,
                 nvfp4_scales: str = "max6"):
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        num_layers = int(text.num_hidden_layers)
        for name, val in (("max_batch_size", max_batch_size), ("max_cache_len", max_cache_len),
                          ("block_size", block_size)):
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"'{name}' = {val!r}; expected an int >= 1")
        self.format = format
        # The NVFP4 group-scale rule ("max6" | "adaptive", docs/nvfp4_scales.md), checked here
        # (ValueError) rather than at the first write.
        make_layout(format, 1, int(block_size), 1, 128, nvfp4_scales=nvfp4_scales)
        self.nvfp4_scales = nvfp4_scales
        self.block_size = int(block_size)
        self._max_batch_size = int(max_batch_size)
        self._max_cache_len = int(max_cache_len)
        self.max_blocks_per_seq = -(-self.max_cache_len // self.block_size)
        if num_blocks is None:
            num_blocks = self.max_batch_size * self.max_blocks_per_seq
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"'num_blocks' = {num_blocks!r}; expected an int >= 1")
        self.num_blocks = int(num_blocks)
        # The config's geometry, until the first K/V gives the model's own (_set_geometry); a
        # config with per-layer values (transformers' heterogeneous configs) has no global one.
        self.num_q_heads = int(text.num_attention_heads)
        self.num_kv_heads = int(_config_value(text, "num_key_value_heads") or self.num_q_heads)
        self.head_dim = int(_config_value(text, "head_dim") or text.hidden_size // self.num_q_heads)
        self.v_head_dim = self.head_dim
        self._geometry_known = False
        self.windows = _layer_windows(text, num_layers)
        self._device = None if device is None else torch.device(device)
        self.kv: Optional[PagedKVCache] = None  # allocated on the first update (on the K's device)
        super().__init__(layers=[_PagedLayer(self, w) for w in self.windows])
        self._clear()

    # ---- state of the batch
    def _clear(self) -> None:
        self._columns = 0            # columns seen, padding included (transformers' sequence length)
        self._new_columns = 0        # of which the current forward's
        self._bt = BlockTables(self.num_blocks, self.block_size, self.max_blocks_per_seq)  # pages of the batch
        self._calibrated = [False] * len(self.windows)
        self._last_layer = None
        self._pending_layer: Optional[int] = None  # updated, its attention not run yet
        self._step: Optional[_Step] = None
        self._dev: Dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        """Frees every block and forgets the batch (the pages and calibrated scales stay allocated;
        a new batch recalibrates)."""
        super().reset()
        self._clear()
        if self.kv is not None:
            self.kv.forget_tokens()

    @property
    def device(self) -> Optional[torch.device]:
        return self._device

    @property
    def max_batch_size(self) -> int:  # a property of transformers' Cache in some 5.x releases
        return self._max_batch_size

    @property
    def max_cache_len(self) -> int:
        return self._max_cache_len

    @property
    def page_head_dim(self) -> int:
        """The head_dim of the pages: head_dim and v_head_dim zero-padded to a supported one."""
        return _page_head_dim(max(self.head_dim, self.v_head_dim), "'head_dim'")

    def _set_geometry(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """The model's kv heads and head dims, from its first K/V (batch, kv_heads, n, head_dim);
        afterwards, a check that every K/V has them."""
        if key_states.dim() != 4 or value_states.dim() != 4 or key_states.shape[:3] != value_states.shape[:3]:
            raise ValueError(f"'key_states' / 'value_states': shapes {tuple(key_states.shape)} / "
                             f"{tuple(value_states.shape)}; expected (batch, kv_heads, tokens, head_dim) each")
        got = (int(key_states.shape[1]), int(key_states.shape[3]), int(value_states.shape[3]))
        have = (self.num_kv_heads, self.head_dim, self.v_head_dim)
        if self._geometry_known:
            if got != have:
                _page_head_dim(max(got[1], got[2]), f"layer {layer}'s head_dim")  # the clearer error first
                raise ValueError(f"'key_states' / 'value_states' of layer {layer}: {got[0]} kv heads of head_dim "
                                 f"{got[1]} / {got[2]}; expected the first layer's {have[0]} of {have[1]} / {have[2]} "
                                 "(the cache holds every layer in one geometry)")
            return
        page = _page_head_dim(max(got[1], got[2]), "'key_states' / 'value_states' head_dim")
        if self.kv is not None and (got[0] != self.num_kv_heads or page != self.page_head_dim):
            raise ValueError(f"'key_states' / 'value_states': {got[0]} kv heads of head_dim {got[1]} / {got[2]}; the "
                             f"pages set_scales allocated from the config hold {self.num_kv_heads} of "
                             f"{self.page_head_dim} (a config that does not describe the model)")
        self.num_kv_heads, self.head_dim, self.v_head_dim = got
        self._geometry_known = True

    def _allocate(self, device: torch.device) -> None:
        if self._device is None:
            self._device = device
        self.kv = PagedKVCache(self.format, self.num_blocks, self.block_size, self.num_kv_heads, self.page_head_dim,
                               num_layers=len(self.windows), device=str(self._device),
                               nvfp4_scales=self.nvfp4_scales)
        # Per layer, as torch tensors sharing the cache's memory (CPU pages and counters are NumPy
        # arrays): (K pages, V pages, saturation counters), made once for every later call.
        def as_torch(x):
            return x if isinstance(x, torch.Tensor) else torch.from_numpy(x)

        counters = as_torch(self.kv.saturation_counters)
        self._pages = [(as_torch(self.kv.k(i)), as_torch(self.kv.v(i)), counters[i])
                       for i in range(len(self.windows))]

    # ---- transformers' Cache interface
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Makes this cache the forward's current one and returns K and V unchanged: the attention
        function writes them (the cache's only copy) and attends over the pages."""
        if not 0 <= layer_idx < len(self.layers):
            raise ValueError(f"'layer_idx' = {layer_idx}; expected an int in [0, {len(self.layers)})")
        # A later layer of the same forward while an earlier one's attention never came (a new
        # forward starts over: an exception may have ended the last one between the two).
        pending, self._pending_layer = self._pending_layer, None
        if pending is not None and layer_idx > pending:
            raise RuntimeError(f"metrale PagedCache: layer {pending}'s attention did not run through "
                               "attn_implementation 'metrale' (the cache holds only what that attention writes): "
                               "call model.set_attn_implementation('metrale'), or load the model with it; a model "
                               "whose attention does not go through transformers' AttentionInterface cannot use "
                               "this cache")
        self._set_geometry(layer_idx, key_states, value_states)
        if self.kv is None:
            self._allocate(key_states.device)
        if self._last_layer is None or layer_idx <= self._last_layer:  # the first layer of a new forward
            self._columns += int(key_states.shape[2])
            self._new_columns = int(key_states.shape[2])
            self._step = None
        self._last_layer = layer_idx
        self._pending_layer = layer_idx
        self.layers[layer_idx].is_initialized = True
        make_current(self)
        return key_states, value_states

    @property
    def seq_lens(self) -> np.ndarray:
        """Real tokens of each sequence of the batch (a copy; padding is not held)."""
        return self._bt.lens.copy()

    @property
    def block_table(self) -> np.ndarray:
        """The batch's block ids, int32 (batch, max_blocks_per_seq) (a copy of the host table)."""
        return self._bt.table.copy()

    @property
    def allocator(self):
        """The page pool (metrale.BlockAllocator): num_free, num_used, ref_count(block)."""
        return self._bt.allocator

    def set_scales(self, layer: int, *, device: Any = None, **scales: float) -> None:
        """Fixes the scales of `layer` (``k_scale`` / ``v_scale`` for FP8, ``k_global_scale`` /
        ``v_global_scale`` for NVFP4) instead of calibrating them from its first K/V; allocates
        the pages first (on `device`, default the cache's or the CPU) when needed."""
        if self.kv is None:
            self._allocate(torch.device(device) if device is not None else (self._device or torch.device("cpu")))
        self.kv.set_scales(layer, **scales)
        self._calibrated[layer] = True

    def consume(self, layer: int) -> None:
        """Marks `layer`'s update as taken by the metrale attention function (before its checks, so
        an error there is reported as itself, not as a bypassed attention at the next update)."""
        if self._pending_layer == layer:
            self._pending_layer = None

    @property
    def last_updated_layer(self) -> Optional[int]:
        """The layer whose ``update`` came last in this forward (None between forwards)."""
        return self._last_layer

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._columns

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0, *args) -> Tuple[int, int]:
        return self._columns + int(query_length), 0

    def get_max_length(self, layer_idx: Optional[int] = None) -> int:
        return self.max_cache_len

    @property
    def is_compileable(self) -> bool:
        return False

    def crop(self, tokens_to_remove: int) -> None:
        """Removes the last tokens of every sequence, in every layer: what assisted generation
        (speculative decoding, prompt lookup) does with the draft tokens the model rejected.
        ``tokens_to_remove`` < 0 removes that many, 0 none; > 0 keeps that many columns (the
        legacy form of transformers < 5.18; nothing when it is not shorter). Pages no longer
        needed go back to the free list; the next forward writes its tokens over the removed
        slots (the kernels read only each sequence's length). At most the shortest sequence's
        real tokens can go (they are the last columns of every row: left padding)."""
        try:  # an int, or an integer 0-d tensor (what transformers 5.17's assisted decoding passes)
            if isinstance(tokens_to_remove, bool):
                raise TypeError
            tokens_to_remove = operator.index(tokens_to_remove)
        except TypeError:
            raise TypeError(f"'tokens_to_remove' = {tokens_to_remove!r}; expected an int") from None
        remove = -tokens_to_remove if tokens_to_remove <= 0 else max(0, self._columns - tokens_to_remove)
        if remove == 0:
            return
        shortest = int(self._bt.lens.min()) if self._bt.batch else 0
        if remove > shortest:
            raise ValueError(f"'tokens_to_remove' = {tokens_to_remove}: {remove} tokens; expected at most the "
                             f"shortest sequence's {shortest} real tokens")
        self._bt.crop(remove)
        if self._own_last_blocks():  # a shared full block may have become a partial last one
            self._dev["table"].copy_(torch.from_numpy(self._bt.table))
        self._columns -= remove
        self._dev["lens"] -= remove
        self._forget_step()

    def reorder_cache(self, beam_idx: Any) -> None:
        """Beam search: sequence i goes on from the history of sequence ``beam_idx[i]``, in every
        layer. The blocks of the histories kept are shared by reference count (a partial last
        block that several sequences now share is copied for all but one); those of histories
        no beam kept go back to the free list."""
        self._remap(beam_idx, "beam_idx", same_batch=True)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each sequence ``repeats`` times in a row (sharing its blocks as ``reorder_cache`` does)."""
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
            raise ValueError(f"'repeats' = {repeats!r}; expected an int >= 1")
        self._remap(np.repeat(np.arange(self._bt.batch), repeats), "repeats")

    def batch_select_indices(self, indices: Any) -> None:
        """Keeps the sequences ``indices`` (in that order); the blocks only the others held are freed."""
        self._remap(indices, "indices")

    def _remap(self, indices: Any, name: str, same_batch: bool = False) -> None:
        """New sequence i continues old sequence indices[i], in every layer (block references)."""
        if self._bt.batch == 0:
            return
        idx = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices).reshape(-1)
        if not np.issubdtype(idx.dtype, np.integer) or len(idx) == 0 or idx.min() < 0 or idx.max() >= self._bt.batch \
                or (same_batch and len(idx) != self._bt.batch) or len(idx) > self.max_batch_size:
            want = f"{self._bt.batch}" if same_batch else f"1..{self.max_batch_size} (max_batch_size)"
            raise ValueError(f"'{name}': {want} sequence indices in [0, {self._bt.batch}) expected; got {indices!r}")
        if len(idx) != self._bt.batch:
            self._dev = self._device_state(len(idx), self._dev["table"].device)
        self._bt.remap(idx)
        self._own_last_blocks()
        self._dev["table"].copy_(torch.from_numpy(self._bt.table))
        self._dev["lens"].copy_(torch.from_numpy(self._bt.lens.astype(np.int32)))
        self._forget_step()

    @property
    def batch_size(self) -> int:
        return self._bt.batch or -1

    # ---- the step's metadata
    def saturated(self, layer: Optional[int] = None) -> Tuple[int, int]:
        """(K, V) elements written into `layer` (all layers when None) that lay past the range
        calibrated from the prompt and were clipped to the format's largest value (FP8, NVFP4;
        BF16 never clips). Reads the counters back (synchronises on CUDA): poll it between
        requests, not per step; docs/numerics.md says what to do when it grows."""
        if self.kv is None:
            return (0, 0)
        return self.kv.saturated(layer)

    def _forget_step(self) -> None:
        """After the sequences changed between forwards: the next layer call starts a new step."""
        self._step = None
        self._last_layer = None
        self._pending_layer = None

    def _grow(self, b: int, new_len: int) -> None:
        """Gives sequence b the blocks that `new_len` real tokens need (host table)."""
        if new_len > self.max_cache_len:
            raise RuntimeError(f"metrale PagedCache: sequence {b} reaches {new_len} tokens; expected at most "
                               f"max_cache_len = {self.max_cache_len}")
        self._bt.grow(b, new_len)

    def _own_last_blocks(self) -> bool:
        """Gives every sequence whose partial last block others share (beam search) a copy of
        it, in every layer: the next tokens are written there. Returns whether the host table
        changed."""
        src, dst = self._bt.own_last_blocks()
        if src:
            s = torch.tensor(src, dtype=torch.long, device=self._pages[0][0].device)
            d = torch.tensor(dst, dtype=torch.long, device=s.device)
            for k_pages, v_pages, _ in self._pages:
                k_pages[d] = k_pages[s]
                v_pages[d] = v_pages[s]
        return bool(src)

    def _begin_batch(self, batch: int, device: torch.device) -> None:
        if batch > self.max_batch_size:
            raise ValueError(f"batch of {batch} sequences; expected at most max_batch_size = {self.max_batch_size}")
        self._bt.begin(batch)
        self._dev = self._device_state(batch, device)

    def _device_state(self, batch: int, device: torch.device) -> Dict[str, torch.Tensor]:
        """The device mirror of the block table and lengths of a batch."""
        return {"table": torch.zeros((batch, self.max_blocks_per_seq), dtype=torch.int32, device=device),
                "lens": torch.zeros(batch, dtype=torch.int32, device=device)}

    def _prepare(self, batch: int, n: int, mask: Optional[torch.Tensor], device: torch.device) -> "_Step":
        """This forward's slots, lengths and runs, made at its first attention call. Where it
        raises (a batch past max_batch_size, a sequence past max_cache_len, no free block, a
        bad mask), the cache is left as the last forward left it: the columns this forward's
        update counted, the blocks it took and a batch it began are given back, so the next
        generate sees the cache's true length."""
        if self._step is not None:
            return self._step
        cp, dev = self._bt.checkpoint(), self._dev
        try:
            step = self._prepare_step(batch, n, mask, device)
        except Exception:
            self._bt.rollback(cp)
            self._dev = dev  # its lengths change only after every check; columns past them are never read
            self._columns -= self._new_columns
            self._forget_step()
            raise
        self._bt.commit()
        return step

    def _prepare_step(self, batch: int, n: int, mask: Optional[torch.Tensor], device: torch.device) -> "_Step":
        if self._bt.batch == 0:
            self._begin_batch(batch, device)
        elif batch != self._bt.batch:
            raise ValueError(f"a forward of {batch} sequences on a cache holding a batch of {self._bt.batch}; call "
                             "cache.reset() before a new batch")
        dev = self._dev
        if n == 1 and self._bt.lens.min(initial=1) > 0:
            # Decode: every sequence gains one real token. Blocks are handed out on the host (it
            # knows every length); the device table is patched with scalar fills and the slots
            # computed on the device, so nothing here waits for the device.
            longest = int(self._bt.lens.max())
            if longest + 1 > self.max_cache_len:
                raise RuntimeError(f"metrale PagedCache: sequence {int(self._bt.lens.argmax())} reaches {longest + 1} "
                                   f"tokens; expected at most max_cache_len = {self.max_cache_len}")
            grow = np.nonzero(self._bt.lens % self.block_size == 0)[0]
            for b in grow:
                j = int(self._bt.lens[b]) // self.block_size
                self._grow(int(b), int(self._bt.lens[b]) + 1)
                dev["table"][int(b), j] = int(self._bt.table[b, j])
            self._bt.lens += 1
            dev["lens"] += 1
            pos = (dev["lens"] - 1).long()
            page = dev["table"].gather(1, (pos // self.block_size).unsqueeze(1)).squeeze(1).long()
            slots = page * self.block_size + pos % self.block_size
            self._step = _Step(n=1, slots=slots, q_start=None, rows=None, max_q_len=1,
                               max_len=int(self._bt.lens.max()))
            return self._step
        # Several tokens (a prompt, a chunk): the padding mask is read on the host (once per forward).
        if mask is None:
            real = np.ones((batch, n), dtype=bool)
        else:
            if mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] < n:
                raise ValueError(f"'attention_mask': shape {tuple(mask.shape)}; expected the 2-D padding mask "
                                 f"({batch}, >= {n}) (attn_implementation 'metrale' registers its mask function)")
            real = mask[:, -n:].to(torch.bool).cpu().numpy()
        counts = real.sum(axis=1)
        for b in range(batch):
            r = int(counts[b])
            if r and not real[b, n - r:].all():
                raise ValueError(f"'attention_mask': row {b} is not left-padded (padding after a real token); "
                                 "metrale's cache takes left padding only")
            if r < n and self._bt.lens[b] > 0:
                raise ValueError(f"'attention_mask': row {b} pads new tokens after {int(self._bt.lens[b])} cached "
                                 "ones; only a prompt may be padded (a new batch of prompts on this cache needs "
                                 "cache.reset() first)")
        slots = np.full((batch, n), -1, dtype=np.int64)
        for b in range(batch):
            r = int(counts[b])
            if r == 0:
                continue
            start = int(self._bt.lens[b])
            self._grow(b, start + r)
            pos = np.arange(start, start + r)
            slots[b, n - r:] = self._bt.table[b, pos // self.block_size].astype(np.int64) * self.block_size \
                + pos % self.block_size
        self._bt.lens += counts
        q_start = np.zeros(batch + 1, dtype=np.int32)
        np.cumsum(counts, out=q_start[1:])
        rows = np.flatnonzero(real.reshape(-1))
        dev["table"].copy_(torch.from_numpy(self._bt.table))
        dev["lens"].copy_(torch.from_numpy(self._bt.lens.astype(np.int32)))
        self._step = _Step(n=n, slots=torch.from_numpy(slots.reshape(-1)).to(device),
                           q_start=torch.from_numpy(q_start).to(device),
                           rows=None if len(rows) == batch * n else torch.from_numpy(rows).to(device),
                           max_q_len=max(1, int(counts.max(initial=1))), max_len=int(self._bt.lens.max(initial=0)))
        return self._step

    def _calibrate(self, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor) -> None:
        """Scales of `layer` from the absmax of the real rows (slots (batch, n) >= 0) of its first
        K/V (batch, kv_heads, n, head_dim), before writing."""
        self._calibrated[layer] = True
        if self.kv.format == KvFormat.bf16:
            return
        real = (slots >= 0).view(slots.shape[0], 1, slots.shape[1], 1)  # key: (batch, kv_heads, n, head_dim)
        k = float(torch.where(real, key, torch.zeros((), dtype=key.dtype, device=key.device)).abs().amax())
        v = float(torch.where(real, value, torch.zeros((), dtype=value.dtype, device=value.device)).abs().amax())
        self.kv.calibrate_from_absmax(layer, k, v)

    def _plan_len(self, max_len: int) -> int:
        """The decode plan's max_seq_len: the longest sequence rounded up to a power of two (>= 256),
        so a plan is made a few times per generation, not per step."""
        return min(max(256, 1 << max(0, (max_len - 1).bit_length())), self.max_blocks_per_seq * self.block_size)

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: Optional[torch.Tensor], scaling: Optional[float], window: int, softcap: float,
               sinks: Optional[torch.Tensor]) -> torch.Tensor:
        """Writes this forward's K/V of `layer` and attends: (batch, n, q_heads, v_head_dim) bf16."""
        batch, hq, n, dq = query.shape
        kv = (int(key.shape[1]), int(key.shape[3]), int(value.shape[3]))
        if kv != (self.num_kv_heads, self.head_dim, self.v_head_dim):
            raise ValueError(f"'key' / 'value': {kv[0]} kv heads of head_dim {kv[1]} / {kv[2]}, but the model's "
                             f"cache.update handed {self.num_kv_heads} of {self.head_dim} / {self.v_head_dim}: it caches "
                             "something else than the K/V it attends with (as multi-head latent attention caches "
                             "its latent), which metrale's cache does not hold")
        if dq != kv[1]:
            raise ValueError(f"'query': head_dim {dq}; expected K's {kv[1]}")
        dv, d = int(value.shape[3]), self.page_head_dim
        sm = float(scaling) if scaling is not None else 1.0 / math.sqrt(dq)
        if dq != d:  # zero columns add nothing to the scores
            query, key = torch.nn.functional.pad(query, (0, d - dq)), torch.nn.functional.pad(key, (0, d - dq))
        if dv != d:  # nor zero V columns to the kept output
            value = torch.nn.functional.pad(value, (0, d - dv))
        step = self._prepare(batch, n, mask, query.device)
        slots = step.slots.view(batch, n)
        if not self._calibrated[layer]:
            self._calibrate(layer, key, value, slots)
        view = self.kv.layer(layer)
        k_cache, v_cache, sat = self._pages[layer]
        fmt, (k_scale, v_scale) = format_name(self.kv.format), view.tensor_scales
        # K/V are read where they lie (head-major (batch, kv_heads, n, head_dim) views, strided
        # writes): no copy. One token per sequence: one write of (batch, kv_heads, head_dim) rows;
        # a prompt: one write per sequence of its (n, kv_heads, head_dim) view. Clipped elements
        # (values past the prompt's calibrated range) are counted per layer in `sat`: saturated().
        hkv, bs = self.num_kv_heads, self.block_size
        if n == 1:
            torch.ops.metrale.reshape_and_cache_counted(key[:, :, 0], value[:, :, 0], step.slots, k_cache,
                                                        v_cache, fmt, bs, hkv, k_scale, v_scale, sat,
                                                        nvfp4_scales=self.nvfp4_scales)
        else:
            for b in range(batch):
                torch.ops.metrale.reshape_and_cache_counted(key[b].transpose(0, 1), value[b].transpose(0, 1),
                                                            slots[b], k_cache, v_cache, fmt, bs, hkv, k_scale,
                                                            v_scale, sat, nvfp4_scales=self.nvfp4_scales)
        self.kv.mark_written(layer)
        table, lens = self._dev["table"], self._dev["lens"]
        plan_len = self._plan_len(step.max_len)
        if n == 1 and step.rows is None:  # decode: (batch, heads, 1, d) as it comes
            out, _ = torch.ops.metrale.attention(query, k_cache, v_cache, table, lens, fmt, bs, hkv, k_scale,
                                                 v_scale, max_seq_len=plan_len, sliding_window=window,
                                                 sm_scale=sm, sinks=sinks, softcap=softcap)
            return _unpadded(out.view(batch, 1, hq, d), dv)
        # (batch, heads, n, d) -> rows (batch*n, heads, d): a view at batch 1 (heads strided), a
        # copy otherwise; padding rows dropped.
        q_rows = query[0].transpose(0, 1) if batch == 1 else query.transpose(1, 2).reshape(batch * n, hq, d)
        if step.rows is not None:
            q_rows = q_rows.index_select(0, step.rows)
        out, _ = torch.ops.metrale.attention(q_rows, k_cache, v_cache, table, lens, fmt, bs, hkv, k_scale, v_scale,
                                             q_start=step.q_start, max_q_len=step.max_q_len, max_seq_len=plan_len,
                                             sliding_window=window, sm_scale=sm, sinks=sinks, softcap=softcap)
        if step.rows is None:
            return _unpadded(out.view(batch, n, hq, d), dv)
        full = out.new_zeros((batch * n, hq, d))
        full.index_copy_(0, step.rows, out)
        return _unpadded(full.view(batch, n, hq, d), dv)


def _unpadded(out: torch.Tensor, dv: int) -> torch.Tensor:
    """The output's first dv columns (V's own width), contiguous."""
    return out if out.shape[-1] == dv else out[..., :dv].contiguous()


class _Step:
    """One forward's metadata, shared by its layers: slot per column (-1 = padding), run starts
    over the real query rows, their indices among the columns (None: every column is real)."""

    __slots__ = ("n", "slots", "q_start", "rows", "max_q_len", "max_len")

    def __init__(self, n, slots, q_start, rows, max_q_len, max_len):
        self.n, self.slots, self.q_start, self.rows = n, slots, q_start, rows
        self.max_q_len, self.max_len = max_q_len, max_len


