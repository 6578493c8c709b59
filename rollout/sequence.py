"""A request's state in the engine: its tokens, sampling parameters, pages and progress."""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from enum import Enum, auto


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. The seed is required: randomness is a function of (seed, position)."""
    seed: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seeded sampling requires an integer seed per request, got {self.seed!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


def sample_seed(run_seed: int, step: int, prompt_id: str, index: int) -> int:
    """The seed of one RL sample: a 63-bit hash of (run seed, step, prompt id, sample index), distinct
    across all four, so a sample's randomness never depends on its batch or slot."""
    h = hashlib.blake2b(f"{run_seed}\x1f{step}\x1f{prompt_id}\x1f{index}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") >> 1


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


_ids = itertools.count()
PENDING = -1  # a token the device has sampled and the host has not read yet (`Sequence.hold`)


@dataclass(eq=False)
class Sequence:
    """Prompt + generated tokens; `num_computed` tokens already have their keys in the cache."""
    prompt: list[int]
    params: SamplingParams
    block_size: int
    seq_id: int = field(default_factory=lambda: next(_ids))
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_cached: int = 0  # prompt tokens found in the prefix cache
    num_computed: int = 0
    status: Status = Status.WAITING

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("a request needs at least one prompt token")
        self.tokens = list(self.prompt)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt)

    @property
    def completion(self) -> list[int]:
        return self.tokens[self.num_prompt:]

    @property
    def num_blocks(self) -> int:
        return -(-len(self.tokens) // self.block_size)

    def block_tokens(self, i: int) -> list[int]:
        return self.tokens[i * self.block_size:(i + 1) * self.block_size]

    def append(self, token: int, logprob: float) -> None:
        """The next token and its logprob (filling the place `hold` kept for it, if any)."""
        if self.tokens[-1] == PENDING:
            self.tokens[-1] = token
        else:
            self.tokens.append(token)
        self.logprobs.append(logprob)

    def hold(self) -> None:
        """Keep the place of a token still on the device, so that the next step can be scheduled
        before it is read (the engine's overlapped decode); `append` fills it."""
        self.tokens.append(PENDING)

    @property
    def finished(self) -> bool:
        # checked after every decode step: counts, never copies the completion
        done = len(self.tokens) - len(self.prompt)
        return done > 0 and (done >= self.params.max_tokens or self.tokens[-1] in self.params.stop_token_ids)
