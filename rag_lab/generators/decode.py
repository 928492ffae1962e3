"""The batched decoding loop of ``generator=hf``: prompts prefilled in length buckets, then one decoding
batch that finished sequences leave.

transformers' ``generate`` pads a batch to its longest prompt and decodes it until its longest completion
ends, computing every finished row on the way; at batch 64 with prompts of 20-550 tokens and completions of
3-24 that was most of the engine's time (``experiments/bench_rollout.py``). Here:

1. **Prefill in buckets.** Prompts sorted by length are cut into groups of at most
   :data:`PREFILL_TOKENS` padded tokens whose padding stays under :data:`MAX_PADDING` of their real tokens;
   each group is one forward pass (attention costs the square of the padded length, so one long prompt no
   longer makes 63 short ones pay for its length).
2. **One decoding batch.** The groups' KV caches are left-padded to one length and stacked; with ``n``
   samples per prompt the cache is repeated after the prefill (a prompt is read once, not ``n`` times).
3. **Finished rows leave.** After each token the rows that ended (an EOS, a stop string, the token limit)
   are dropped from the batch and the cache, and columns that only padding holds are cut away.

Positions are counted from each row's first real token (as ``generate`` does from the attention mask), so a
row's tokens do not depend on its neighbours beyond float rounding. Greedy at temperature 0; otherwise the
raw logits divided by the temperature, nucleus-filtered at ``top_p``, sampled with ``torch.multinomial``
under the seed the caller set (the same distribution as ``generate``'s sampling, other draws).
Log-probs are those of the raw logits (no temperature), as a forward pass over prompt + completion gives.

Hand-written: transformers has no generation loop that drops finished rows (continuous batching there
needs a paged-attention server; vLLM's is GPU-only).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from rag_lab.generators.base import Sampling

# Padded tokens in one prefill forward pass (rows x longest prompt of the group).
PREFILL_TOKENS = 4096
# A group closes when its padding would exceed this share of its real tokens.
MAX_PADDING = 0.25


@dataclass
class Decoded:
    """One completion's token ids and the log-prob of each (None when not asked for)."""

    tokens: list[int]
    logprobs: list[float] | None


def prefill_groups(lengths: Sequence[int], budget: int = PREFILL_TOKENS) -> list[list[int]]:
    """Indices of ``lengths`` in groups: sorted longest first, each group's padded size (rows x its longest)
    within ``budget`` (a longer prompt alone) and its padding within :data:`MAX_PADDING` of its tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        group = groups[-1] if groups else None
        if group:
            longest, real = lengths[group[0]], sum(lengths[j] for j in group) + lengths[i]
            padded = longest * (len(group) + 1)
            if padded <= budget and padded - real <= MAX_PADDING * real:
                group.append(i)
                continue
        groups.append([i])
    return groups


def _left_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for j, r in enumerate(rows):
        if r:
            ids[j, width - len(r) :] = torch.tensor(r)
            mask[j, width - len(r) :] = 1
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _prefill(model, prompts: list[list[int]], pad_id: int, device) -> tuple[DynamicCache, torch.Tensor, ...]:
    """Every prompt read, in groups; returns the stacked cache, the attention mask and the last logits, rows
    in the order of ``prompts``."""
    caches, masks, logits, order = [], [], [], []
    for group in prefill_groups([len(p) for p in prompts]):
        ids, mask = _left_padded([prompts[i] for i in group], pad_id)
        ids, mask = ids.to(device), mask.to(device)
        cache = DynamicCache(config=model.config)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=_positions(mask),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        caches.append(out.past_key_values)
        masks.append(mask)
        logits.append(out.logits[:, -1].float())
        order += group
    width = max(m.shape[1] for m in masks)
    merged = caches[0]
    back = torch.argsort(torch.tensor(order)).to(device)
    for layer, *parts in zip(merged.layers, *(c.layers for c in caches), strict=True):
        keys = torch.cat([_pad_left(p.keys, width) for p in parts])[back]
        values = torch.cat([_pad_left(p.values, width) for p in parts])[back]
        for p in parts:  # each group's layer goes once merged: the cache is never held twice over
            p.keys = p.values = None
        layer.keys = keys
        layer.values = values
    mask = torch.cat([torch.nn.functional.pad(m, (width - m.shape[1], 0)) for m in masks])[back]
    return merged, mask, torch.cat(logits)[back]


def _pad_left(kv: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(kv, (0, 0, width - kv.shape[-2], 0))


def _choose(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    if sampling.temperature <= 0:
        return logits.argmax(-1)
    scaled = logits / sampling.temperature
    if sampling.top_p < 1.0:
        sorted_logits, idx = scaled.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop the tokens past the nucleus; the most likely one always stays
        drop = probs.cumsum(-1) - probs > sampling.top_p
        scaled = scaled.scatter(-1, idx, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(scaled.softmax(-1), 1).squeeze(-1)


def decode(
    model,
    prompts: list[list[int]],
    sampling: Sampling,
    pad_id: int,
    end_ids: set[int],
    stopped: Callable[[list[list[int]]], list[bool]] | None = None,
    logprobs: bool = True,
) -> list[Decoded]:
    """``sampling.n`` completions of each prompt (token ids), rows ordered prompt by prompt; a row ends at a
    token of ``end_ids`` (kept), when ``stopped`` says so of its tokens (a stop string; one call per step
    for every active row), or at ``sampling.max_new_tokens``."""
    device = model.device
    cache, mask, logits = _prefill(model, prompts, pad_id, device)
    positions = mask.sum(-1)
    if sampling.n > 1:
        cache.batch_repeat_interleave(sampling.n)
        mask, logits, positions = (t.repeat_interleave(sampling.n, 0) for t in (mask, logits, positions))
    rows = len(prompts) * sampling.n
    out = [Decoded([], [] if logprobs else None) for _ in range(rows)]
    active = torch.arange(rows, device=device)
    end = torch.tensor(sorted(end_ids), device=device)
    for step in range(sampling.max_new_tokens):
        chosen = _choose(logits, sampling)
        rows_now = active.tolist()
        for row, token in zip(rows_now, chosen.tolist(), strict=True):
            out[row].tokens.append(token)
        if logprobs:
            lp = torch.log_softmax(logits, -1).gather(-1, chosen[:, None]).squeeze(-1)
            for row, value in zip(rows_now, lp.tolist(), strict=True):
                out[row].logprobs.append(value)
        done = torch.isin(chosen, end)
        if stopped is not None:
            done |= torch.tensor(stopped([out[r].tokens for r in rows_now]), device=device)
        if step + 1 == sampling.max_new_tokens or bool(done.all()):
            break
        keep = (~done).nonzero().squeeze(-1)
        if len(keep) < len(active):
            cache.batch_select_indices(keep)
            active, mask, positions, chosen = active[keep], mask[keep], positions[keep], chosen[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
        mask, cache = _trim(mask, cache)
        step_out = model(
            input_ids=chosen[:, None],
            attention_mask=mask,
            position_ids=positions[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        cache, logits, positions = step_out.past_key_values, step_out.logits[:, -1].float(), positions + 1
    return out


def _trim(mask: torch.Tensor, cache: DynamicCache) -> tuple[torch.Tensor, DynamicCache]:
    """Cut the leading columns that are padding in every remaining row (the mask's last column is the token
    about to be read, not yet in the cache)."""
    first = int(mask.any(0).long().argmax())
    if first > 0:
        for layer in cache.layers:
            layer.keys = layer.keys[..., first:, :]
            layer.values = layer.values[..., first:, :]
        mask = mask[:, first:]
    return mask, cache
