"""Greedy generation with a language-model library as MLC-LLM exports them
(:class:`LanguageModel`).
"""

from __future__ import annotations

import json
import os
from typing import Any, List, Optional, Sequence, Union

import numpy as np

from .. import _native
from .device import _device_pair, cpu
from .module import Module, load_module


class LanguageModel:
    """A language-model library as MLC-LLM exports them (``embed``, ``prefill``, ``decode``,
    ``create_tir_paged_kv_cache``, ``_metadata``), for greedy generation with no TVM, as ``mblob
    generate`` does: ``LanguageModel("model.so", weights="params/").generate([1, 2, 3], 16)``.
    ``weights`` is the tensor cache directory (``tensor-cache.json`` and its shards) of a library
    whose functions take the weights as ``packed_params``; a library with the weights bound
    needs none."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", Module],
        weights: Optional[Union[str, "os.PathLike[str]"]] = None,
        device: Any = None,
        page_size: int = 16,
    ) -> None:
        mod = path if isinstance(path, Module) else load_module(path)
        dev = _device_pair(device if device is not None else cpu(), "LanguageModel(device)")
        self._lm = _native.LanguageModel(mod._library, dev, None if weights is None else os.fspath(weights), int(page_size))
        self.logits: Optional[np.ndarray] = None
        self.decode_seconds: List[float] = []

    @property
    def metadata(self) -> dict:
        """The model's ``_metadata``, parsed."""
        return json.loads(self._lm.metadata)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 16) -> List[int]:
        """The new token ids after ``prompt_ids`` (greedy, in a new KV cache). Afterwards
        ``logits`` holds the logits they were picked from (``[tokens, vocab]``, float32) and
        ``decode_seconds`` the time of each decode step."""
        tokens, logits, vocab, seconds = self._lm.generate([int(t) for t in prompt_ids], int(max_new_tokens))
        self.logits = np.frombuffer(logits, dtype=np.float32).reshape(len(tokens), vocab) if vocab else None
        self.decode_seconds = list(seconds)
        return list(tokens)
