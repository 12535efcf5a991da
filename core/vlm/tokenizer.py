"""An offline tokenizer for vision-language models: byte-level BPE trained with the ``tokenizers`` library.

Nothing is downloaded. A model trained here gets its tokenizer from the text it will see (questions, answers,
templates); a user's real VLM folder brings its own ``tokenizer.json`` and is loaded as is. The special tokens
are the Qwen-VL family's, so that the chat template and the image-token id mean the same thing for both::

    tok = build_tokenizer(corpus, vocab_size=1024)
    tok.save_pretrained(folder)                 # tokenizer.json + tokenizer_config.json
    tok = load_tokenizer(folder)                # identical ids
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.errors import CheckpointError, ConfigError

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 1024, min_frequency: int = 2) -> Any:
    """Train a byte-level BPE tokenizer on ``corpus`` (any text encodes: no unknown token).

    The special tokens come first (ids 0..6, ``SPECIAL_TOKENS`` order); the 256 byte symbols follow, then the
    merges, so ``vocab_size`` must leave room for at least the bytes.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ConfigError(f"tokenizer vocab_size must be >= {len(SPECIAL_TOKENS) + 256} (special tokens + bytes), "
                          f"got {vocab_size}")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=IM_END,
                                   extra_special_tokens={"image_token": IMAGE_PAD})


def load_tokenizer(folder: str | Path) -> Any:
    """The tokenizer saved in ``folder`` (``tokenizer.json``), offline; a one-line error if there is none."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        raise CheckpointError(f"{folder}: no tokenizer (tokenizer.json) in this folder")
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder}: cannot load its tokenizer ({str(e).splitlines()[0]})") from None
    check_special_tokens(tok, str(folder))
    return tok


def check_special_tokens(tok: Any, where: str = "tokenizer") -> None:
    """Refuse a tokenizer that lacks the chat / image special tokens the template uses."""
    vocab = tok.get_vocab()
    missing = [t for t in (IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD) if t not in vocab]
    if missing:
        raise CheckpointError(f"{where}: the tokenizer lacks the special tokens {missing} (a Qwen-VL-style "
                              "tokenizer is expected)")
    if tok.pad_token_id is None:
        tok.pad_token = PAD if PAD in vocab else IM_END


def token_id(tok: Any, token: str) -> int:
    """The id of one special token (e.g. ``IMAGE_PAD``)."""
    i = tok.convert_tokens_to_ids(token)
    if i is None or (tok.unk_token_id is not None and i == tok.unk_token_id):
        raise CheckpointError(f"the tokenizer has no token {token!r}")
    return int(i)
