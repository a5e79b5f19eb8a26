"""Small real models for the GRPO tests: a byte-level tokenizer with a ChatML template and a tiny random
Llama, saved as an ordinary HF checkpoint directory; plus hand-made rollout trajectories."""

from __future__ import annotations

from pathlib import Path

from conductor.trajectory import Round, Trajectory, trajectory_id

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_checkpoint(dest: Path, seed: int = 0) -> Path:
    """A 2-layer Llama (hidden 32) over a 256-byte BPE vocabulary with ChatML specials; a few MB on disk."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|pad|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


def rollout(run: str, qid: str, rewards: list[float | None], completions: list[str] | None = None,
            prompt: str = "Route: what is 2+2?", domain: str = "math", pool: str = "simulated-4@v1",
            token_ids: list[list[int]] | None = None, logprobs: list[list[float]] | None = None,
            subpool: list[str] | None = None) -> list[Trajectory]:
    """One GRPO group: a trajectory per reward (None = infra-failed); ``subpool``: the workers the prompt lists."""
    out = []
    for i, r in enumerate(rewards):
        comp = (completions or [f"model_id = [{i % 3}]"] * len(rewards))[i]
        rnd = Round(0, prompt, comp, token_ids[i] if token_ids else None, logprobs[i] if logprobs else None, "ok")
        out.append(Trajectory(trajectory_id=trajectory_id(run, qid, i), run_id=run, kind="rollout", question_id=qid,
                              dataset="toy", domain=domain, question=prompt, sample_index=i, pool_id=pool,
                              rounds=[rnd], reward=r, correct=(r == 1.0) if r is not None else None, subpool=list(subpool or []),
                              infra_failed=r is None, infra_cause="rate_limited" if r is None else None))
    return out
