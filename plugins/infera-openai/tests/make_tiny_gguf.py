"""Write a tiny llama-architecture GGUF model with random weights, offline.

    python plugins/infera-openai/tests/make_tiny_gguf.py <out.gguf>

Needs the ``gguf`` package (and numpy, its dependency); ``.ci/steps/30-llamacpp-venv.sh`` runs
it with ``.venv-llamacpp``'s interpreter. The model is 2 layers, 64 wide (4 heads of 16, 2 KV
heads), F32, context 2048, with a SentencePiece-style vocabulary (control tokens, the 256
byte-fallback tokens, printable ASCII and a few words) and a ChatML chat template, so
llama-server loads it and serves ``/v1/completions`` and ``/v1/chat/completions``. Its text
is random: tests check the API, not the words.
"""

from __future__ import annotations

import string
import sys
from pathlib import Path

import gguf
import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_LAYER = 2
N_FF = 128
N_CTX = 2048
HEAD_DIM = N_EMBD // N_HEAD

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

WORDS = ("hello", "world", "the", "a", "cache", "prefix", "route", "token", "infera", "tiny")


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, types): <unk> <s> </s>, chat markers, <0x00>…<0xFF>, ASCII, words."""
    tt = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL, tt.CONTROL, tt.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(tt.BYTE)
    for ch in string.ascii_letters + string.digits + string.punctuation:
        tokens.append(ch)
        types.append(tt.NORMAL)
    tokens.append("\u2581")  # SentencePiece's word boundary (a space)
    types.append(tt.NORMAL)
    for word in WORDS:
        tokens.append("\u2581" + word)
        types.append(tt.NORMAL)
    # longer pieces score higher, so the tokenizer prefers whole words
    scores = [0.0 if t != tt.NORMAL else float(len(tok)) - 10.0 for tok, t in zip(tokens, types, strict=True)]
    return tokens, scores, [int(t) for t in types]


def write(path: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("infera-tiny-llama")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)

    def t(name: str, *shape: int, scale: float = 0.1) -> None:
        # numpy shape (rows, cols) is GGML's ne = [cols, rows]: (out, in) for a weight matrix
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    kv = HEAD_DIM * N_HEAD_KV
    t("token_embd.weight", n_vocab, N_EMBD, scale=1.0)
    ones("output_norm.weight", N_EMBD)
    t("output.weight", n_vocab, N_EMBD)
    for i in range(N_LAYER):
        ones(f"blk.{i}.attn_norm.weight", N_EMBD)
        t(f"blk.{i}.attn_q.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.attn_k.weight", kv, N_EMBD)
        t(f"blk.{i}.attn_v.weight", kv, N_EMBD)
        t(f"blk.{i}.attn_output.weight", N_EMBD, N_EMBD)
        ones(f"blk.{i}.ffn_norm.weight", N_EMBD)
        t(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: make_tiny_gguf.py <out.gguf>", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    write(out)
    print(f"tiny GGUF model: {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
