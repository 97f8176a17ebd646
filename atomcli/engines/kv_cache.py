"""A KV cache layer that appends in place: what the rollout engine decodes with.

transformers' `DynamicLayer.update` is `torch.cat([keys, new], dim=-2)`: every decode step
copies the layer's whole cache. For a batch of 8 trajectories 1.5k tokens deep on SmolLM2
that is ~0.5 GB of copying per step, as much time as the model's own matmuls
(bench/bench_rollout.py). `GrowLayer` keeps keys and values in buffers with room to spare
(sized by the caller for the turn, or doubled when full) and writes each step's states
into the next free slots; `keys`/`values` are views of the filled part, so attention sees
exactly what `DynamicLayer` would give it.

Rows leave and join in place too: `batch_select_indices` moves kept rows inside the buffer,
and `add_rows` writes a joining row's KV into a row left spare, ending where the others end.

It stays a `DynamicLayer` for everything else (masks, sequence length, batch selection), and
if some library code replaces `keys`/`values` behind its back it adopts the new tensors on
the next call instead of writing into stale buffers.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class GrowLayer(DynamicLayer):
    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None, length: int = 0):
        """Optionally start from preallocated buffers [batch, heads, capacity, dim] whose first `length` slots are filled."""
        super().__init__()
        self._n, self._exposed = length, None
        self._own(keys, values)
        if keys is not None:
            self.device = keys.device
            self.is_initialized = True
            self._expose()

    def _own(self, keys: torch.Tensor | None, values: torch.Tensor | None) -> None:
        """New buffers: all their rows are live. `_k`/`_v` are the live rows, a prefix of `_rows_k`/`_rows_v`, whose
        spare rows (left by finished rows) `add_rows` fills again."""
        self._k, self._v = self._rows_k, self._rows_v = keys, values

    def _expose(self) -> None:
        self.keys = self._k[:, :, :self._n]
        self.values = self._v[:, :, :self._n]
        self._exposed = self.keys

    def _sync(self) -> None:
        """Adopt tensors someone assigned to keys/values directly (crop, reorder, reset...)."""
        if self._k is not None and self.keys is self._exposed:
            return
        if self.keys is None or self.keys.numel() == 0:
            self._own(None, None)
            self._n = 0
        else:
            self._own(self.keys.contiguous(), self.values.contiguous())
            self._n = self.keys.shape[-2]
            self._expose()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._sync()
        need = self._n + key_states.shape[-2]
        if self._k is None or self._k.shape[-2] < need or self._k.shape[0] != key_states.shape[0]:
            shape = (*key_states.shape[:2], max(2 * need, 64), key_states.shape[-1])
            k, v = key_states.new_zeros(shape), value_states.new_zeros(shape)
            if self._n:
                k[:, :, :self._n] = self._k[:, :, :self._n]
                v[:, :, :self._n] = self._v[:, :, :self._n]
            self._own(k, v)
        self._k[:, :, self._n:need] = key_states
        self._v[:, :, self._n:need] = value_states
        self._n = need
        self._expose()
        return self.keys, self.values

    def rewind(self, length: int) -> None:
        """Keep the first `length` slots; the next update writes from there, over what followed.

        `score-ig` scores answers after ever shorter prefixes of one sequence this way: no copy,
        and the slots a shorter prefix needs are never the ones overwritten."""
        self._sync()
        self._n = max(0, min(self._n, length))
        if self._k is not None:
            self._expose()

    def get_seq_length(self) -> int:
        self._sync()
        return self._n

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices`, in that order, inside the same buffer: only rows whose place changes are copied
        (gathered first, so a row may move onto one that moves away). The engine fills a finished row's place with
        a row from the end of the batch (`fill_holes`), one copy per finished row, where a new full-capacity buffer
        at every finished row cost a rollout a noticeable share of its time (bench/RESULTS.md)."""
        self._sync()
        if self._k is None:
            return
        idx = indices.tolist()
        if not idx or min(idx) < 0 or max(idx) >= self._k.shape[0] or len(idx) > self._k.shape[0]:
            self._own(self._k[indices], self._v[indices])
            self._expose()
            return
        moved = [(p, j) for p, j in enumerate(idx) if p != j]
        if moved:
            dst = torch.tensor([p for p, _ in moved], device=self._k.device)
            src = torch.tensor([j for _, j in moved], device=self._k.device)
            n = self._n
            self._k[dst, :, :n] = self._k[src, :, :n]  # the right side is gathered first: overlapping rows are safe
            self._v[dst, :, :n] = self._v[src, :, :n]
        self._k, self._v = self._k[:len(idx)], self._v[:len(idx)]
        self._expose()

    def add_rows(self, rows: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Append rows after the live ones, each given as its own (keys, values) [heads, m, dim] with m <= the filled
        length, placed so that they end where the others do (the caller's mask hides the slots before them). Spare
        rows of the buffer are reused; more rows than it has make a larger one (the live rows copied once)."""
        self._sync()
        b, want = self._k.shape[0], self._k.shape[0] + len(rows)
        if self._rows_k.shape[0] < want:
            self._regrow((want, *self._k.shape[1:]))
        self._k, self._v = self._rows_k[:want], self._rows_v[:want]
        for r, (keys, values) in enumerate(rows):
            m = keys.shape[-2]
            self._k[b + r, :, :self._n - m] = 0
            self._k[b + r, :, self._n - m:self._n] = keys
            self._v[b + r, :, :self._n - m] = 0
            self._v[b + r, :, self._n - m:self._n] = values
        self._expose()

    def pad_left(self, k: int) -> None:
        """Put `k` empty slots before every row's filled ones (a longer row is about to join)."""
        self._sync()
        if k <= 0 or self._k is None:
            return
        self._regrow((*self._k.shape[:2], max(self._k.shape[-2], self._n + k), self._k.shape[-1]), at=k)
        self._n += k
        self._expose()

    def _regrow(self, shape: tuple[int, ...], at: int = 0) -> None:
        """New zeroed buffers of `shape`, the live rows' filled slots copied into its first rows from slot `at` on."""
        k, v = self._k.new_zeros(shape), self._v.new_zeros(shape)
        b = self._k.shape[0]
        k[:b, :, at:at + self._n] = self._k[:, :, :self._n]
        v[:b, :, at:at + self._n] = self._v[:, :, :self._n]
        self._own(k, v)


def fill_holes(n: int, keep: list[int]) -> list[int]:
    """The rows to keep of a batch of `n`, ordered so that few move: a kept row inside the first len(keep) places
    stays where it is, and each place left by a finished row takes a kept row from beyond them."""
    m = len(keep)
    tail = [j for j in keep if j >= m]
    kept = set(keep)
    return [p if p in kept else tail.pop() for p in range(m)]
