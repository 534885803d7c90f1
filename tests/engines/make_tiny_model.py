"""Make the tiny random-weight Llama used by the real-vLLM test (offline, ~5 s).

Run it with the vLLM venv's interpreter (it needs torch, transformers, tokenizers):
``.venv-vllm/bin/python tests/engines/make_tiny_model.py OUT_DIR``.

The model: a byte-level BPE (vocab 4096) trained on a synthetic pseudo-word corpus,
wrapped as a fast tokenizer with a simple chat template, and a 2-layer Llama
(hidden 128, 4 heads → head_dim 32, the smallest the vLLM CPU kernels accept) with
random bfloat16 weights. Deterministic: fixed seeds.
"""

from __future__ import annotations

import random
import sys

SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ra",
    "tu",
    "se",
    "no",
    "vi",
    "pe",
    "da",
    "qu",
    "ze",
    "fo",
    "gi",
    "ha",
    "ju",
    "be",
    "ch",
    "sh",
    "th",
    "an",
    "er",
    "in",
    "on",
    "re",
]
COMMON = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "is",
    "in",
    "that",
    "it",
    "for",
    "you",
    "are",
    "with",
    "on",
    "as",
    "be",
    "this",
    "was",
    "have",
    "or",
    "by",
]
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def corpus(rng: random.Random, sentences: int = 20000) -> list[str]:
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    words += COMMON
    out = []
    for _ in range(sentences):
        n = rng.randint(5, 25)
        out.append(" ".join(rng.choice(words) for _ in range(n)) + rng.choice(".?!,"))
    return out


def main(out: str) -> None:
    import torch  # type: ignore[import-not-found]  # runs in .venv-vllm only
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # type: ignore[import-not-found]

    rng = random.Random(0)
    torch.manual_seed(0)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(rng), trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=bos,
        eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("<pad>"),
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    print(f"tiny model written to {out}: vocab {len(fast)}, params {model.num_parameters()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny")
