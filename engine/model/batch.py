"""One forward step described flat (varlen), the contract between generator, model and kernels."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """B sequences laid out as T consecutive tokens; see ARCHITECTURE.md for each field's meaning."""

    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    cu_q: torch.Tensor  # (B+1,) int32
    kv_lens: torch.Tensor  # (B,) int32, lengths including this step's tokens
    block_table: torch.Tensor  # (B, P) int32
    slot_mapping: torch.Tensor  # (T,) int64
    logit_rows: torch.Tensor  # (R,) int64
    prompt_rows: torch.Tensor | None = None  # (P,) int64 rows holding prompt (prefill) tokens; None: not told
    logit_offsets: tuple[int, ...] = ()  # (B+1,) sequence i's logits are rows [offsets[i], offsets[i+1]) of forward()
    # Embedding inputs (images): rows whose input is a given vector instead of a token's embedding
    # (input_ids >= 1e9 there); engine.generator.embeddings builds them from the jobs' MMEmbeddings.
    mm_rows: torch.Tensor | None = None  # (E,) int64
    mm_vectors: torch.Tensor | None = None  # (E, hidden)
    # Runs of embedding rows that attend to each other both ways (Gemma 3's images): (sequence, first row,
    # end row, end position) with the whole run's K/V written by this step (engine.model.image_attention).
    mm_blocks: tuple[tuple[int, int, int, int], ...] = ()

    @classmethod
    def build(
        cls,
        seqs: list[tuple[list[int], int, list[int]]],
        page_size: int,
        logit_rows_per_seq: list[int] | None = None,
        device: torch.device | str = "cpu",
        prompt_seqs: list[bool | int] | None = None,
    ) -> "Batch":
        """seqs: (new token ids, start position, page list) per sequence.

        logit_rows_per_seq[i] = how many trailing tokens of sequence i need logits (default 1; 0 for none).
        prompt_seqs[i] = sequence i feeds prompt tokens (a prefill chunk) rather than generated ones; the
        model may treat those rows differently (engine/model/qlinear/routing.py), always per sequence, never per batch.
        An int says how many of its leading tokens are prompt tokens (a chunk that refeeds a preempted job's
        prompt and reply: its reply's rows take the path they took when they were generated).
        The result's logit_offsets say where each sequence's rows land in the forward's logits.
        """
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        cu = [0]
        kv_lens: list[int] = []
        rows: list[int] = []
        prompt: list[int] = []
        offsets = [0]
        width = max(len(pages) for _, _, pages in seqs)
        table = torch.zeros((len(seqs), max(width, 1)), dtype=torch.int32)
        for i, (tokens, start, pages) in enumerate(seqs):
            n = len(tokens)
            ids.extend(tokens)
            pos.extend(range(start, start + n))
            for p in range(start, start + n):
                slots.append(pages[p // page_size] * page_size + p % page_size)
            if pages:
                table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
            want = 1 if logit_rows_per_seq is None else logit_rows_per_seq[i]
            rows.extend(range(cu[-1] + n - want, cu[-1] + n))
            offsets.append(len(rows))
            if prompt_seqs is not None and prompt_seqs[i]:
                k = n if isinstance(prompt_seqs[i], bool) else min(int(prompt_seqs[i]), n)
                prompt.extend(range(cu[-1], cu[-1] + k))
            cu.append(cu[-1] + n)
            kv_lens.append(start + n)
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.long, device=device),
            positions=torch.tensor(pos, dtype=torch.long, device=device),
            cu_q=torch.tensor(cu, dtype=torch.int32, device=device),
            kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
            block_table=table.to(device),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            logit_rows=torch.tensor(rows, dtype=torch.long, device=device),
            prompt_rows=None if prompt_seqs is None else torch.tensor(prompt, dtype=torch.long, device=device),
            logit_offsets=tuple(offsets),
        )
