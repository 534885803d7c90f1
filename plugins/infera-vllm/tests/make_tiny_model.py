"""Make the tiny random-weight Llama used by the real-vLLM test (offline, ~5 s).

Run it with the vLLM venv's interpreter (it needs torch, transformers, tokenizers):
``.venv-vllm/bin/python plugins/infera-vllm/tests/make_tiny_model.py OUT_DIR``.

The model: a byte-level BPE (vocab 4096) trained on a synthetic pseudo-word corpus,
wrapped as a fast tokenizer with two named chat templates (``default`` and ``tool_use``, from
``infera_core/testing/tiny_chat.py``: ``chat_template.jinja`` and
``additional_chat_templates/tool_use.jinja``), and a 2-layer Llama
(hidden 128, 4 heads → head_dim 32, the smallest the vLLM CPU kernels accept) with
random bfloat16 weights. Deterministic: fixed seeds.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

# the tokenizer's corpus: more syllables and words than the routing tests' tiny tokenizer
SYLLABLES = ["ka", "lo", "mi", "ra", "tu", "se", "no", "vi", "pe", "da", "qu", "ze", "fo", "gi", "ha", "ju"]
SYLLABLES += ["be", "ch", "sh", "th", "an", "er", "in", "on", "re"]
MORE_COMMON = ["was", "have", "or", "by"]


def main(out: str) -> None:
    import torch  # type: ignore[import-not-found]  # runs in .venv-vllm only
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # type: ignore[import-not-found]

    # the engine venv need not have infera_core installed: the tokenizer code comes from the tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from infera_core.testing import tiny_chat
    from infera_core.testing import tiny_tokenizer as tiny

    rng = random.Random(0)
    torch.manual_seed(0)
    words = [*tiny.COMMON, *MORE_COMMON]
    corpus = tiny.pseudo_corpus(rng, 20000, SYLLABLES, words, n_words=3000, endings=".?!,")
    tok = tiny.train_bpe(corpus, 4096)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=2048,
    )
    fast.chat_template = dict(tiny_chat.TEMPLATES)
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=tok.token_to_id("<s>"),
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
