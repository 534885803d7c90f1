"""A tiny byte-level BPE model directory trained offline (``tokenizers`` only, no torch).

Mirrors ``make_tiny_model.py`` from the vLLM recipe: pseudo-word corpus, vocab 4096,
special tokens ``<unk> <s> </s> <pad>``, a post-processor that prepends ``<s>``, and the
chat template ``<s>{role}\\n{content}</s>\\n`` … ``<s>assistant\\n`` in
``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
SYLLABLES = ["ka", "lo", "mi", "ra", "tu", "se", "no", "vi", "pe", "da", "qu", "ze", "fo", "gi", "ha", "ju"]


def make_tiny_model_dir(out: str | Path, vocab: int = 1024, sentences: int = 3000, seed: int = 0) -> Path:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` into ``out``; returns the directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(800)]
    words += [
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
    ]
    corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 25))) + "." for _ in range(sentences)]
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d
