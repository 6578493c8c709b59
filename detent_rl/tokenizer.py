"""Tokenizers for rollouts and training: a checkpoint's own (transformers) or an in-process byte-level one.

Both are one `Tokenizer` class over a transformers fast tokenizer, so chat templating, special-token
parsing and decoding follow a single code path:
- `encode(text)` adds no special tokens (no BOS/EOS); special-token text such as "<|im_end|>" in
  `text` becomes its one special id. A chat prompt gets what its template writes, nothing more.
- `apply_chat(messages)` renders the chat template to text with the generation prompt, then
  encodes that text: the ids are exactly `encode(<rendered prompt>)`.
- `eos_token_ids` are the generation stop tokens: the tokenizer's eos, the checkpoint's
  generation_config eos ids, and the end-of-turn / end-of-text markers its vocabulary has.
- `vocab_size` counts every id the tokenizer can emit (added tokens included); a model's embedding
  may be larger, never smaller. `decode` drops ids at or above it (a padded model vocabulary's
  extra rows), as transformers does.

`tiny_tokenizer` serves `model.builtin: tiny`: token id b < 256 is the byte b (so any text
round-trips), then <|endoftext|>, <|im_start|>, <|im_end|> at 256, 257, 258, with a ChatML template.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Markers that end a turn or a document in common vocabularies; each one present is a stop token.
_STOP_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
TINY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or used as asked; the message names the directory or tokenizer."""


class Tokenizer:
    """The project's tokenizer: a transformers fast tokenizer plus the stop tokens of generation."""

    def __init__(self, hf: Any, name: str, extra_eos: Sequence[int] = ()) -> None:
        self.hf, self.name = hf, name
        vocab = hf.get_vocab()
        ids = [hf.eos_token_id, *extra_eos, *(vocab[m] for m in _STOP_MARKERS if m in vocab)]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in ids if i is not None))
        if not self.eos_token_ids:
            raise TokenizerError(f"{name}: the tokenizer has no eos token and none of {_STOP_MARKERS}")
        self.vocab_size: int = len(hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat(self, messages: list[dict]) -> list[int]:
        if not getattr(self.hf, "chat_template", None):
            raise TokenizerError(f"{self.name}: the tokenizer has no chat template; use the plain prompt template")
        text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.encode(text)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, eos_token_ids={self.eos_token_ids})"


def load_tokenizer(checkpoint_dir: str | Path) -> Tokenizer:
    """The tokenizer of an HF checkpoint directory, read offline (tokenizer.json + tokenizer_config.json);
    its generation_config.json eos ids, when present, are stop tokens too."""
    path = Path(checkpoint_dir).expanduser()
    if not path.is_dir():
        raise TokenizerError(f"{path}: tokenizer directory does not exist")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise TokenizerError(f"{path}: no tokenizer.json or tokenizer_config.json in the directory")
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises many types here; all mean "this dir has no usable tokenizer"
        raise TokenizerError(f"{path}: could not load the tokenizer ({type(e).__name__}: {e})") from e
    return Tokenizer(hf, str(path), _generation_eos(path))


def _generation_eos(path: Path) -> list[int]:
    config = path / "generation_config.json"
    if not config.is_file():
        return []
    try:
        eos = json.loads(config.read_text()).get("eos_token_id")
    except (OSError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{config}: unreadable generation config ({e})") from e
    eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in eos):
        raise TokenizerError(f"{config}: eos_token_id must be an int or a list of ints, got {eos!r}")
    return eos


def tiny_tokenizer(vocab_size: int) -> Tokenizer:
    """The in-process byte-level tokenizer of the builtin tiny model: 256 byte tokens and the three
    specials (259 ids); `vocab_size` is the model's vocabulary, which must hold all of them."""
    size = 256 + len(TINY_SPECIALS)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < size:
        raise TokenizerError(f"tiny tokenizer: vocab_size must be an int >= {size} (256 bytes + "
                             f"{len(TINY_SPECIALS)} specials), got {vocab_size!r}")
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RawTokenizer
    from transformers import PreTrainedTokenizerFast

    # Byte-level BPE without merges: every byte is its own token, so id == byte value.
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    raw = RawTokenizer(models.BPE(vocab, []))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TINY_SPECIALS])
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", bos_token="<|im_start|>",
                                 pad_token="<|endoftext|>", unk_token="<|endoftext|>",
                                 chat_template=TINY_CHAT_TEMPLATE, clean_up_tokenization_spaces=False)
    tok = Tokenizer(hf, "builtin:tiny")
    if tok.vocab_size != size or hf.convert_tokens_to_ids(list(TINY_SPECIALS)) != list(range(256, size)):
        raise TokenizerError(f"tiny tokenizer: built {tok.vocab_size} ids, expected bytes 0..255 then "
                             f"{TINY_SPECIALS} at 256..{size - 1}")
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map that the ByteLevel pre-tokenizer/decoder use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars

