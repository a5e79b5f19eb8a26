"""Conductor sampling with HuggingFace transformers (CPU or GPU).

WHY: it is the one backend that loads both the embedded GGUF files (``gguf_file=``,
de-quantised to float) and the checkpoint directories GRPO training writes, and
it is the trainable model itself, so the log-probs it reports are exactly the
behaviour policy's. Loading a GGUF de-quantises and converts its tokenizer, which
is slow; the converted checkpoint is saved once under ``$CONDUCTOR_HOME/hf/`` and
reused (``cache_converted=True``).

Log-probs are of the sampled tokens under the sampling distribution, i.e.
``log_softmax(logits / temperature)`` (raw ``log_softmax(logits)`` when greedy);
top-p truncation is not folded in, matching what a GRPO ratio recomputes.

Constrained decoding (``GenerationParams.grammar``, the project's GBNF): llguidance
(the grammar engine behind llama.cpp's ``%llguidance`` mode and vLLM's ``guidance``
backend; no dependencies, CPU wheel) converts the GBNF and a ``LogitsProcessor``
(``conductor.decoding.mask``) masks the whole batch's next-token scores on the model's
device to what the grammar allows, before temperature and top-p. Log-probs stay those
of the unconstrained model, as on the other backends.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.decoding.mask import GrammarLogitsProcessor
from conductor.decoding.vocabulary import eos_token_ids, llguidance_vocabulary, output_size
from conductor.generation import Generation, GenerationParams
from conductor.local.transformers_server import converted_dir

if TYPE_CHECKING:
    from conductor.decoding.contract import ConductorFormat


class TransformersBackend:
    name = "transformers"

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 8, system_prompt: str | None = None,
                 source: str = "<in-memory>", share_prefill: bool = True,
                 generate_kwargs: dict[str, Any] | None = None):
        """Wrap an already-loaded model and tokenizer (e.g. the policy being trained).

        ``generate_kwargs`` go to every ``model.generate`` call (e.g. a ``logits_processor`` for
        constrained decoding); log-probs stay those of the unconstrained model distribution."""
        self.model = model
        self.share_prefill = share_prefill
        self.generate_kwargs = dict(generate_kwargs or {})
        self.tokenizer = tokenizer
        self.batch_size = max(1, batch_size)
        self.system_prompt = system_prompt
        self.source = source
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.eos_ids = eos_token_ids(model, tokenizer)
        self._lltok: tuple[int, Any] | None = None     # (vocabulary size, llguidance tokenizer), built once
        # A checkpoint's decoding contract (conductor_format.json, conductor.decoding.contract): when set, every
        # generation decodes under its grammar for the number of workers the caller says the prompt lists.
        self.conductor_format: ConductorFormat | None = None

    @classmethod
    def load(cls, path: str | Path, gguf_file: str | None = None, *, device: str | None = None, dtype: str | None = None,
             cache_converted: bool = True, threads: int | None = None, **kwargs: Any) -> TransformersBackend:
        """Load a HF checkpoint dir, a ``.gguf`` file path, or (dir, gguf_file); local files only.

        ``threads`` sets torch's (process-wide) CPU thread count: on a busy 2-core machine
        one thread is many times faster than two spinning OpenMP threads.
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)

        path = Path(path)
        if gguf_file is None and path.suffix == ".gguf":
            path, gguf_file = path.parent, path.name
        if not path.exists():
            raise FileNotFoundError(f"transformers backend: {path} does not exist")
        if gguf_file is not None and not (path / gguf_file).is_file():
            raise FileNotFoundError(f"transformers backend: {path / gguf_file} does not exist")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
        source = str(path / gguf_file) if gguf_file else str(path)
        load_from, gguf = path, gguf_file
        if gguf_file is not None and cache_converted:
            converted = converted_dir(path / gguf_file)
            if (converted / "config.json").is_file():
                load_from, gguf = converted, None
        tok_kwargs = {"gguf_file": gguf} if gguf else {}
        tokenizer = AutoTokenizer.from_pretrained(load_from, local_files_only=True, **tok_kwargs)
        # Any: transformers' decorated methods (``to``) do not type-check on the loaded model class
        model: Any = AutoModelForCausalLM.from_pretrained(load_from, local_files_only=True, dtype=torch_dtype,
                                                          **tok_kwargs)
        if gguf is not None and cache_converted:
            _save_converted(model, tokenizer, converted_dir(path / gguf))
        model.to(device)
        model.eval()
        tokenizer.padding_side = "left"
        backend = cls(model, tokenizer, source=source, **kwargs)
        if gguf_file is None and path.is_dir():
            from conductor.decoding.contract import load_format

            backend.conductor_format = load_format(path)
        return backend

    # ------------------------------------------------------------ generation

    def render(self, prompt: str) -> str:
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
            {"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        """n samples per prompt. With n > 1 each batch holds samples of ONE prompt, whose prefill is computed
        once and shared (a GRPO group costs one prompt pass, not G); with n = 1 prompts are left-padded
        into batches of ``batch_size``."""
        import torch

        if self.conductor_format is not None:
            return self._generate_formatted(prompts, n, params)
        out: list[list[Generation]] = [[] for _ in prompts]
        if params.seed is not None:
            torch.manual_seed(params.seed)
        if n > 1 and self.share_prefill:
            for i, p in enumerate(prompts):
                text = self.render(p)
                for start in range(0, n, self.batch_size):
                    out[i] += self._generate_batch([text] * min(self.batch_size, n - start), params, shared=True)
            return out
        rows = [(i, self.render(p)) for i, p in enumerate(prompts) for _ in range(n)]
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start:start + self.batch_size]
            for (i, _), gen in zip(chunk, self._generate_batch([text for _, text in chunk], params)):
                out[i].append(gen)
        return out

    def _generate_formatted(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        """Generate under the checkpoint's own grammar, over the ``params.n_workers`` workers the prompts list."""
        from dataclasses import replace

        if params.n_workers is None:
            raise ValueError(f"transformers backend ({self.source}): this checkpoint decodes under its workflow "
                             "grammar, which needs the number of workers the prompt lists (GenerationParams.n_workers)")
        fmt, self.conductor_format = self.conductor_format, None
        assert fmt is not None
        try:
            return self.generate(prompts, n, replace(params, grammar=fmt.grammar(params.n_workers)))
        finally:
            self.conductor_format = fmt

    def _generate_batch(self, texts: list[str], params: GenerationParams, shared: bool = False) -> list[Generation]:
        """One ``generate`` call; ``shared``: all texts are the same prompt, prefilled once (exact)."""
        import torch

        tok = self.tokenizer
        tok.padding_side = "left"
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.model.device)
        extra: dict[str, Any] = {}
        if shared and len(texts) > 1 and enc["input_ids"].shape[1] > 1:
            # Prefill all but the last prompt token once, then copy the KV cache to every row: generate()
            # sees a cache covering the prompt and feeds only the last token (cache_position).
            with torch.inference_mode():
                pre = self.model(input_ids=enc["input_ids"][:1, :-1], use_cache=True)
            cache = pre.past_key_values
            cache.batch_repeat_interleave(len(texts))
            extra["past_key_values"] = cache
        sample = params.temperature > 0
        kwargs: dict[str, Any] = dict(
            max_new_tokens=params.max_tokens, do_sample=sample, output_logits=True, return_dict_in_generate=True,
            pad_token_id=tok.pad_token_id, eos_token_id=sorted(self.eos_ids) or None,
            repetition_penalty=1.0, min_p=None, top_k=0,   # override checkpoint defaults: plain T/top-p sampling
        )
        if sample:
            kwargs.update(temperature=params.temperature, top_p=params.top_p)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=tok)
        gen_kwargs = {**kwargs, **self.generate_kwargs}
        if params.grammar:
            from transformers import LogitsProcessorList

            gen_kwargs["logits_processor"] = LogitsProcessorList(
                [*(self.generate_kwargs.get("logits_processor") or []), self.grammar_processor(params.grammar)])
        with torch.inference_mode():
            res = self.model.generate(**enc, **gen_kwargs, **extra)
        prompt_len = enc["input_ids"].shape[1]
        new = res.sequences[:, prompt_len:]
        logits = torch.stack(res.logits, dim=1).float()             # [batch, new_len, vocab]
        if sample:
            logits = logits / params.temperature
        lp = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        gens = []
        for b in range(new.shape[0]):
            ids = new[b].tolist()
            n_keep, finish = len(ids), "length"
            for j, t in enumerate(ids):
                if t in self.eos_ids:
                    n_keep, finish = j + 1, "stop"      # keep the EOS: the policy must learn to stop
                    break
            ids = ids[:n_keep]
            text = tok.decode(ids, skip_special_tokens=True)
            for s in params.stop:
                cut = text.find(s)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
            logprobs = [float(x) for x in lp[b, :n_keep].tolist()] if params.logprobs else None
            if logprobs is not None and not all(math.isfinite(x) for x in logprobs):
                raise ValueError(f"transformers backend ({self.source}): non-finite log-prob in a sampled completion")
            mask = enc["attention_mask"][b].bool()
            gens.append(Generation(text=text, token_ids=ids, logprobs=logprobs, finish_reason=finish,
                                   prompt_token_ids=enc["input_ids"][b][mask].tolist()))
        return gens

    def grammar_processor(self, grammar: str) -> GrammarLogitsProcessor:
        """A fresh processor (one matcher per batch row) for one ``generate`` call."""
        return GrammarLogitsProcessor(self.llguidance_tokenizer(), grammar, self.eos_ids)

    def llguidance_tokenizer(self) -> Any:
        """llguidance's view of this model's vocabulary, built once (rebuilt if the output size changes)."""
        n_vocab = output_size(self.model)
        if self._lltok is None or self._lltok[0] != n_vocab:
            self._lltok = (n_vocab, llguidance_vocabulary(self.model, self.tokenizer, self.eos_ids))
        return self._lltok[1]

    def close(self) -> None:
        self.model = None


def detach_gguf_quantizer(model: Any) -> Any:
    """Make a GGUF-loaded model saveable with ``save_pretrained``.

    transformers marks GGUF loads as "quantized" and refuses to save them, but the
    weights are already de-quantised floats; dropping the marker lets training
    checkpoints and the conversion cache be written as ordinary safetensors.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is not None and str(getattr(method, "value", method)).lower() == "gguf":
        model.hf_quantizer = None
        for attr in ("is_quantized", "_is_quantized"):
            if getattr(model, attr, False) is True:
                try:
                    setattr(model, attr, False)
                except AttributeError:
                    pass
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    return model


def _save_converted(model: Any, tokenizer: Any, dest: Path) -> None:
    """Write the converted checkpoint atomically (temp dir + rename); losing the race is fine."""
    import shutil
    import tempfile
    import warnings

    if (dest / "config.json").is_file():
        return
    detach_gguf_quantizer(model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(dest)
    except Exception as e:   # the cache is an optimisation: never fail a load because it could not be written
        shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(f"could not cache the converted checkpoint at {dest}: {e}", stacklevel=2)
