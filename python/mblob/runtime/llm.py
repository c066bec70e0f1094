"""Generation with a language-model library as MLC-LLM exports them (:class:`LanguageModel`):
greedy or with TVM's sampling, one sequence or a batch.
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
    ``create_tir_paged_kv_cache``, ``_metadata``), for generation with no TVM, as ``mblob
    generate`` does: ``LanguageModel("model.so", weights="params/").generate([1, 2, 3], 16)``.
    ``weights`` is the tensor cache directory (``tensor-cache.json`` and its shards) of a library
    whose functions take the weights as ``packed_params``; a library with the weights bound
    needs none.

    A library without ``_metadata`` (the model functions alone, as TVM's ``nn.llm`` exports
    them) reads its weights as the tensor cache's ``param_0``, ``param_1``, ... and takes what
    the metadata would give from the keyword arguments: ``context_window_size`` (or
    ``max_total_seq_len``, the KV cache's size; -1 for a sliding-window model, which then needs
    the cache's size), ``prefill_chunk_size`` (default: the context window or cache, at most
    8192), ``max_batch_size`` (1), ``sliding_window_size`` and ``attention_sink_size`` (none),
    ``vocab_size`` (the logits' length). With ``_metadata`` a given one must agree with it.
    ``kv_cache_bytes`` sizes the cache from a memory budget.

    On OpenCL, ``opencl_program_cache`` is a file of the kernels' compiled programs
    in TVM's layout (``opencl.GetPreCompiledPrograms``): written when it does not exist, loaded
    when it does (``mblob generate --opencl-program-cache``).

    ``temperature`` 0 (the default) picks the token of largest logit; above 0 each token is drawn
    with TVM's ``sample_top_p_from_logits`` from the ``top_p`` most likely tokens, with MLC-LLM's
    seeded draws (``seed``; sequence ``i`` of a batch gets ``seed + i``), as ``mblob generate
    --temperature --top-p --seed``."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", Module],
        weights: Optional[Union[str, "os.PathLike[str]"]] = None,
        device: Any = None,
        page_size: int = 16,
        *,
        context_window_size: Optional[int] = None,
        prefill_chunk_size: Optional[int] = None,
        max_batch_size: Optional[int] = None,
        max_total_seq_len: Optional[int] = None,
        kv_cache_bytes: Optional[int] = None,
        sliding_window_size: Optional[int] = None,
        attention_sink_size: Optional[int] = None,
        vocab_size: Optional[int] = None,
        opencl_program_cache: Optional[Union[str, "os.PathLike[str]"]] = None,
    ) -> None:
        mod = path if isinstance(path, Module) else load_module(path)
        dev = _device_pair(device if device is not None else cpu(), "LanguageModel(device)")
        given = {
            "context_window_size": context_window_size,
            "prefill_chunk_size": prefill_chunk_size,
            "max_batch_size": max_batch_size,
            "max_total_seq_len": max_total_seq_len,
            "kv_cache_bytes": kv_cache_bytes,
            "sliding_window_size": sliding_window_size,
            "attention_sink_size": attention_sink_size,
            "vocab_size": vocab_size,
        }
        settings = {k: int(v) for k, v in given.items() if v is not None}
        cache = None if opencl_program_cache is None else os.fspath(opencl_program_cache)
        self._lm = _native.LanguageModel(
            mod._library, dev, None if weights is None else os.fspath(weights), int(page_size), settings, cache
        )
        self.logits: Optional[np.ndarray] = None
        self.decode_seconds: List[float] = []

    @property
    def metadata(self) -> dict:
        """The model's ``_metadata``, parsed."""
        return json.loads(self._lm.metadata)

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int = 16,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> List[int]:
        """The new token ids after ``prompt_ids``, in a new KV cache (greedy at ``temperature``
        0, else sampled). Afterwards ``logits`` holds the logits they were picked from
        (``[tokens, vocab]``, float32) and ``decode_seconds`` the time of each decode step."""
        return self._took(
            *self._lm.generate(
                [int(t) for t in prompt_ids], int(max_new_tokens), float(temperature), float(top_p), int(seed)
            )
        )
    def continue_generation(self, prompt_ids: Sequence[int], max_new_tokens: int = 16) -> List[int]:
        """The next turn of the last generation's sequence, in the same KV cache: its last new
        token and ``prompt_ids`` are prefilled (through the library's ``extend`` when it has
        one, as MLC-LLM's engine continues a sequence), then up to ``max_new_tokens`` new ids
        (greedy). ``logits`` and ``decode_seconds`` as after :meth:`generate`."""
        return self._took(*self._lm.continue_generation([int(t) for t in prompt_ids], int(max_new_tokens)))

    def _took(self, tokens: List[int], logits: bytes, vocab: int, seconds: List[float]) -> List[int]:
        self.logits = np.frombuffer(logits, dtype=np.float32).reshape(len(tokens), vocab) if vocab else None
        self.decode_seconds = list(seconds)
        return list(tokens)

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 16,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> List[List[int]]:
        """The new token ids after each of ``prompts``, run as one batch in a new KV cache
        through ``batch_prefill`` and ``batch_decode``, as MLC-LLM's engine runs a batch (and as
        ``mblob generate`` does with several ``--prompt-ids``): sequence ``i`` is ``prompts[i]``.
        Afterwards ``logits`` holds the logits of every sequence (``[sequences, tokens, vocab]``,
        float32) and ``decode_seconds`` the time of each decode step of the batch."""
        seqs = [[int(t) for t in p] for p in prompts]
        return self._took_batch(
            *self._lm.generate_batch(seqs, int(max_new_tokens), float(temperature), float(top_p), int(seed))
        )

    def continue_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 16,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> List[List[int]]:
        """The next turn of the sequences of the last :meth:`generate_batch` (or
        ``continue_batch``), in the same KV cache, one prompt per sequence: each sequence's last
        new token and ``prompts[i]`` are prefilled (through the library's ``batch_extend`` when
        it has ``extend``, as MLC-LLM's engine continues sequences), then the batch decodes up to
        ``max_new_tokens`` new ids each (sequence ``i`` seeded ``seed + i`` anew). ``logits``
        and ``decode_seconds`` as after :meth:`generate_batch`."""
        seqs = [[int(t) for t in p] for p in prompts]
        return self._took_batch(
            *self._lm.continue_batch(seqs, int(max_new_tokens), float(temperature), float(top_p), int(seed))
        )

    def _took_batch(self, tokens: List[List[int]], logits: bytes, vocab: int, seconds: List[float]) -> List[List[int]]:
        steps = len(tokens[0]) if tokens else 0
        self.logits = np.frombuffer(logits, dtype=np.float32).reshape(len(tokens), steps, vocab) if vocab else None
        self.decode_seconds = list(seconds)
        return [list(t) for t in tokens]
