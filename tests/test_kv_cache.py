"""GrowLayer: decoding with in-place appends gives exactly what transformers' DynamicLayer gives."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from atomcli.engines.kv_cache import GrowLayer, fill_holes


@pytest.fixture(scope="module")
def model(tiny_model):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()


def _decode(model, cache, steps: int, *, select_at: int | None = None, crop_at: int | None = None):
    """Prefill 3 rows of 20 tokens, then `steps` greedy steps; optionally drop row 1 or crop the cache midway."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (3, 20), generator=g)
    attn = torch.ones_like(ids)
    attn[1:, :4] = 0  # left padding, as the engine batches rows of different lengths
    out = []
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=attn, use_cache=True, cache=cache).logits[:, -1]
        for step in range(steps):
            nxt = logits.argmax(-1, keepdim=True)
            if step == select_at:
                keep = torch.tensor([0, 2])
                cache.batch_select_indices(keep)
                nxt, attn = nxt[keep], attn[keep]
            if step == crop_at:
                cache.crop(-2)
                attn = attn[:, :-2]
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], 1)
            logits = model(input_ids=nxt, attention_mask=attn, use_cache=True, cache=cache).logits[:, -1]
            out.append(logits.clone())
    return out, cache


def _grow_cache():
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowLayer
    return cache


@pytest.mark.parametrize("case", [{}, {"select_at": 5}, {"crop_at": 7}, {"select_at": 3, "crop_at": 9}])
def test_same_logits_as_dynamic_layer_through_growth_selection_and_crop(model, case):
    reference, _ = _decode(model, DynamicCache(), 40, **case)   # 40 steps: the buffer (2 x 20) must grow
    grown, cache = _decode(model, _grow_cache(), 40, **case)
    assert cache.layers and all(type(layer) is GrowLayer for layer in cache.layers)
    for a, b in zip(reference, grown):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_appends_in_place_without_copying_the_cache():
    layer = GrowLayer()
    k = torch.randn(2, 3, 5, 4)
    layer.update(k, k.clone())
    buffer = layer._k
    for _ in range(4):
        keys, _ = layer.update(torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4))
        assert layer._k is buffer and keys.data_ptr() == buffer.data_ptr()  # a view, not a new tensor
    assert layer.get_seq_length() == 9 and torch.equal(layer.keys[:, :, :5], k)


def test_preallocated_buffers_are_filled_after_the_past():
    k = torch.zeros(1, 2, 10, 4)
    k[:, :, :3] = 1.0
    layer = GrowLayer(k, k.clone(), 3)
    assert layer.get_seq_length() == 3
    keys, values = layer.update(torch.full((1, 2, 2, 4), 2.0), torch.full((1, 2, 2, 4), 2.0))
    assert keys.shape[-2] == 5 and layer._k is k
    assert keys[0, 0, :, 0].tolist() == [1.0, 1.0, 1.0, 2.0, 2.0]


def test_dropping_rows_moves_the_kept_ones_down_in_the_same_buffer():
    k = torch.arange(4 * 2 * 8 * 3, dtype=torch.float32).reshape(4, 2, 8, 3)
    v = -k
    layer = GrowLayer(k.clone(), v.clone(), 5)
    buffer = layer._k
    layer.batch_select_indices(torch.tensor([1, 3]))  # rows 0 and 2 finished
    assert layer._k.data_ptr() == buffer.data_ptr() and layer.get_seq_length() == 5
    assert torch.equal(layer.keys, k[[1, 3], :, :5]) and torch.equal(layer.values, v[[1, 3], :, :5])
    keys, _ = layer.update(torch.ones(2, 2, 1, 3), torch.ones(2, 2, 1, 3))
    assert torch.equal(keys[:, :, :5], k[[1, 3], :, :5]) and bool((keys[:, :, 5] == 1).all())
    # rows in another order move inside the same buffer too; only more rows than it holds need a new one
    layer.batch_select_indices(torch.tensor([1, 0]))
    assert layer._k.data_ptr() == buffer.data_ptr()
    assert torch.equal(layer.keys[:, :, :5], k[[3, 1], :, :5]) and torch.equal(layer.values[:, :, :5], v[[3, 1], :, :5])
    layer.batch_select_indices(torch.tensor([1, 0, 0]))
    assert layer._k.data_ptr() != buffer.data_ptr()
    assert torch.equal(layer.keys[:, :, :5], k[[1, 3, 3], :, :5])


@pytest.mark.parametrize("n, keep, want", [
    (5, [1, 3, 4], [4, 1, 3]),      # the last kept rows fill the places of rows 0 and 2
    (4, [0, 1, 2], [0, 1, 2]),      # only the last row finished: nothing moves
    (4, [3], [3]),
    (6, [0, 2, 5], [0, 5, 2]),
])
def test_fill_holes_moves_one_row_per_finished_row(n, keep, want):
    got = fill_holes(n, keep)
    assert got == want and sorted(got) == keep
    assert sum(p != j for p, j in enumerate(got)) <= n - len(keep)


def test_filling_holes_gives_the_same_logits_as_dropping_rows_in_order(model):
    """The engine's selection (rows from the end fill the finished rows' places) changes where a row sits in the
    batch, not what it computes."""
    def run(order):
        cache = _grow_cache()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 1000, (5, 12), generator=g)
        attn = torch.ones_like(ids)
        attn[2:, :3] = 0
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=attn, use_cache=True, cache=cache).logits[:, -1]
            keep = order(5, [1, 3, 4])
            cache.batch_select_indices(torch.tensor(keep))
            nxt, attn = logits.argmax(-1, keepdim=True)[keep], attn[keep]
            attn = torch.cat([attn, attn.new_ones((3, 1))], 1)
            out = model(input_ids=nxt, attention_mask=attn, use_cache=True, cache=cache).logits[:, -1]
        return {row: out[p] for p, row in enumerate(keep)}
    in_order, filled = run(lambda n, keep: keep), run(fill_holes)
    for row in (1, 3, 4):
        torch.testing.assert_close(filled[row], in_order[row], rtol=0, atol=1e-6)


def test_rows_join_in_spare_rows_ending_where_the_others_end():
    k = torch.arange(3 * 2 * 8 * 3, dtype=torch.float32).reshape(3, 2, 8, 3)
    layer = GrowLayer(k.clone(), -k.clone(), 5)
    buffer = layer._k
    layer.batch_select_indices(torch.tensor([2]))        # two rows finished: their rows are spare
    new = torch.full((2, 3, 3), 7.0)                      # a row 3 slots long joins one 5 slots long
    layer.add_rows([(new, -new), (new[:, :1], -new[:, :1])])
    assert layer._k.data_ptr() == buffer.data_ptr()      # in the spare rows, no new buffer
    assert layer.keys.shape == (3, 2, 5, 3) and torch.equal(layer.keys[0], k[2, :, :5])
    assert torch.equal(layer.keys[1, :, 2:], new) and not layer.keys[1, :, :2].any()
    assert torch.equal(layer.values[2, :, 4:], -new[:, :1]) and not layer.values[2, :, :4].any()
    layer.add_rows([(new, -new)])                         # more rows than the buffer holds: a larger one
    assert layer._k.data_ptr() != buffer.data_ptr() and layer.keys.shape[0] == 4
    assert torch.equal(layer.keys[0], k[2, :, :5]) and torch.equal(layer.keys[3, :, 2:], new)
    layer.pad_left(2)                                     # room for a longer row before every row
    assert layer.get_seq_length() == 7 and not layer.keys[:, :, :2].any()
    assert torch.equal(layer.keys[0, :, 2:], k[2, :, :5]) and torch.equal(layer.keys[3, :, 4:], new)
    keys, _ = layer.update(torch.ones(4, 2, 1, 3), torch.ones(4, 2, 1, 3))
    assert keys.shape[-2] == 8 and bool((keys[:, :, 7] == 1).all())
