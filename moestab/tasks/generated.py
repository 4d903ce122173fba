"""Base of the embedded tasks that generate examples from an RNG, with a fixed held-out split.

The split is a property of the prompt, not of a seed: a prompt is held out when the CRC-32 of its UTF-8
bytes is divisible by ``HELD_OUT_BUCKETS`` (about 1 prompt in 10). ``sample`` never returns such a
prompt and ``eval_set`` returns only such prompts, so the eval set is unseen in training whatever the
seeds. Problem spaces under ``MIN_SPLIT_SPACE`` prompts are too small to split: there both draw from the
whole space and ``held_out`` is false.
"""

from __future__ import annotations

import random
import zlib
from abc import abstractmethod

from moestab.tasks.base import Example, Task, check_count

HELD_OUT_BUCKETS = 10
MIN_SPLIT_SPACE = 1000
# eval_set gives up looking for new distinct held-out prompts after this many draws in a row found none
# (only happens in small problem spaces); a rule independent of n keeps eval sets prefixes of each other.
_MAX_DRAWS_WITHOUT_NEW = 5000


def is_held_out_prompt(prompt: str) -> bool:
    """Whether ``prompt`` belongs to the held-out (eval) side of a generated task's split."""
    return zlib.crc32(prompt.encode("utf-8")) % HELD_OUT_BUCKETS == 0


class GeneratedTask(Task):
    """A task that draws random examples; subclasses implement ``draw`` and ``space_size``."""

    @abstractmethod
    def draw(self, rng: random.Random) -> Example:
        """One random example drawn with ``rng``, from the whole problem space (both sides of the split)."""

    @property
    @abstractmethod
    def space_size(self) -> int:
        """Number of distinct prompts ``draw`` can produce (approximate is fine; decides whether to split)."""

    @property
    def held_out(self) -> bool:
        return self.space_size >= MIN_SPLIT_SPACE

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """``n`` i.i.d. training examples (duplicates possible), never from the held-out side."""
        check_count(n)
        examples: list[Example] = []
        while len(examples) < n:
            example = self.draw(rng)
            if not (self.held_out and is_held_out_prompt(example.prompt)):
                examples.append(example)
        return examples

    def eval_set(self, n: int, seed: int) -> list[Example]:
        """``n`` distinct held-out examples drawn with ``random.Random(seed)``.

        ``eval_set(m, seed)`` is a prefix of ``eval_set(n, seed)`` for ``m <= n``. When the held-out side
        has fewer than ``n`` distinct prompts, the ones found are repeated in order to make ``n``.
        """
        check_count(n)
        rng = random.Random(seed)
        examples: list[Example] = []
        seen: set[str] = set()
        draws_without_new = 0
        while len(examples) < n and draws_without_new < _MAX_DRAWS_WITHOUT_NEW:
            example = self.draw(rng)
            if (self.held_out and not is_held_out_prompt(example.prompt)) or example.prompt in seen:
                draws_without_new += 1
                continue
            draws_without_new = 0
            seen.add(example.prompt)
            examples.append(example)
        if examples and len(examples) < n:
            examples = [examples[i % len(examples)] for i in range(n)]
        return examples
