"""A tiny byte-level BPE model directory trained offline (``tokenizers`` only, no torch).

The tokenizer of ``plugins/infera-vllm/tests/make_tiny_model.py`` (the real-vLLM tests' model, which
builds it with :func:`pseudo_corpus` and :func:`train_bpe` from here), smaller: pseudo-word
corpus, special tokens ``<unk> <s> </s> <pad>``, a post-processor that prepends ``<s>``,
and the chat template ``<s>{role}\\n{content}</s>\\n`` … ``<s>assistant\\n`` in
``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
SYLLABLES = ["ka", "lo", "mi", "ra", "tu", "se", "no", "vi", "pe", "da", "qu", "ze", "fo", "gi", "ha", "ju"]
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
]
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]


def pseudo_corpus(
    rng: random.Random,
    sentences: int,
    syllables: list[str] = SYLLABLES,
    common: list[str] = COMMON,
    n_words: int = 800,
    endings: str = ".",
) -> list[str]:
    """Sentences of 5-25 words: ``n_words`` pseudo-words of 1-4 ``syllables`` plus ``common``
    words, each sentence ended by one of ``endings``."""
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(n_words)]
    words += common
    out = []
    for _ in range(sentences):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(5, 25)))
        out.append(text + (rng.choice(endings) if len(endings) > 1 else endings))
    return out


def train_bpe(corpus: list[str], vocab: int) -> Tokenizer:
    """A byte-level BPE of ``vocab`` tokens trained on ``corpus``, prepending ``<s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def make_tiny_model_dir(out: str | Path, vocab: int = 1024, sentences: int = 3000, seed: int = 0) -> Path:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` into ``out``; returns the directory."""
    tok = train_bpe(pseudo_corpus(random.Random(seed), sentences), vocab)
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
