"""NgramIndex: speculative decoding's draft proposer from a job's own tokens (prompt lookup).

Each job keeps its own index, so proposing needs nothing but the job's tokens; the model drafter
(speculative.py) is the other proposer. The generator verifies either's drafts the same way.
"""
from __future__ import annotations


class NgramIndex:
    """For every n-gram (n <= max_ngram) of a job's tokens, where it last occurred; proposes what followed."""

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram
        self.next_pos: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # tokens[:indexed] are in the index

    def update(self, tokens: list[int]) -> None:
        for p in range(max(self.indexed, 1), len(tokens)):
            for n in range(1, min(self.max_ngram, p) + 1):
                self.next_pos[tuple(tokens[p - n : p])] = p
        self.indexed = max(self.indexed, len(tokens))

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Continue the longest suffix of tokens seen before with what followed it (up to k tokens)."""
        self.update(tokens)
        # Look up the suffix as it stood before the last token was indexed as a key's follower.
        for n in range(min(self.max_ngram, len(tokens)), 0, -1):
            p = self.next_pos.get(tuple(tokens[-n:]))
            if p is not None and p < len(tokens):
                return tokens[p : p + k]
        return []
