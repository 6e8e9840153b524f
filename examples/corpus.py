"""A generated text corpus for the example: no downloads, the same text for the same seed.

Sentences come from a small probabilistic grammar over a fixed vocabulary, so the text has real
structure (agreement, clauses, punctuation) for a character-level model to learn: the loss falls
well below that of a uniform guess within a few hundred steps.
"""

from __future__ import annotations

import random

_SUBJECTS = ["the optimizer", "a subgroup", "the scheduler", "every gradient", "the allocator",
             "a pinned arena", "the GPU", "the host", "each layer", "the model"]
_VERBS = ["updates", "copies", "waits for", "frees", "measures", "plans", "overlaps with",
          "offloads", "reads", "writes"]
_OBJECTS = ["the weights", "its moments", "the headroom", "a stream", "the next subgroup",
            "pinned memory", "the update phase", "the forward pass", "the backward pass",
            "the memory curve"]
_ADVERBS = ["quickly", "in place", "asynchronously", "on the CPU", "on the GPU", "again",
            "before the update", "after the backward pass"]
_CONNECTIVES = ["while", "because", "after", "before", "so that"]


def _clause(rng: random.Random) -> str:
    words = [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)]
    if rng.random() < 0.5:
        words.append(rng.choice(_ADVERBS))
    return " ".join(words)


def sentence(rng: random.Random) -> str:
    text = _clause(rng)
    if rng.random() < 0.4:
        text += ", " + rng.choice(_CONNECTIVES) + " " + _clause(rng)
    return text[0].upper() + text[1:] + "."


def generate(characters: int, seed: int = 0) -> str:
    """About `characters` characters of text."""
    rng = random.Random(seed)
    parts: list[str] = []
    length = 0
    while length < characters:
        parts.append(sentence(rng))
        length += len(parts[-1]) + 1
    return " ".join(parts)
