"""Write a tiny llama-architecture GGUF model with random weights, offline.

    python plugins/infera-openai/tests/make_tiny_gguf.py <out.gguf> [<width> <ff> <layers>]

Needs the ``gguf`` package (and numpy, its dependency); ``.ci/steps/30-llamacpp-venv.sh`` runs
it with ``.venv-llamacpp``'s interpreter. The model is 2 layers, 64 wide (4 heads of 16, 2 KV
heads), F32, context 2048, with a SentencePiece-style vocabulary (control tokens, the 256
byte-fallback tokens, printable ASCII and a few words) and a ChatML chat template, so
llama-server loads it and serves ``/v1/completions`` and ``/v1/chat/completions``. Its text
is random: tests check the API, not the words. Width, feed-forward size and layers can be
given (8 heads of ``width / 8``, 4 KV heads then): ``512 2048 8`` makes a 127 MB model that
decodes about 20 ms a token on one thread, slow enough for a test to act in mid-generation.
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


def write(path: Path, seed: int = 0, size: tuple[int, int, int] | None = None) -> None:
    n_embd, n_ff, n_layer = size or (N_EMBD, N_FF, N_LAYER)
    n_head, n_head_kv = (N_HEAD, N_HEAD_KV) if size is None else (8, 4)
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("infera-tiny-llama")
    w.add_context_length(N_CTX)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
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

    kv = head_dim * n_head_kv
    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    ones("output_norm.weight", n_embd)
    t("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        ones(f"blk.{i}.attn_norm.weight", n_embd)
        t(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        t(f"blk.{i}.attn_k.weight", kv, n_embd)
        t(f"blk.{i}.attn_v.weight", kv, n_embd)
        t(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        ones(f"blk.{i}.ffn_norm.weight", n_embd)
        t(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 4):
        print("usage: make_tiny_gguf.py <out.gguf> [<width> <ff> <layers>]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    size = (int(argv[1]), int(argv[2]), int(argv[3])) if len(argv) == 4 else None
    write(out, size=size)
    print(f"tiny GGUF model: {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
