"""Build a tiny random-weight Llama for vLLM, entirely locally (run by tests/support/vllm_peer.py).

It runs with the vLLM environment's Python, which has numpy, safetensors and tokenizers (vLLM
needs them), so the project's own test dependencies stay as they are. Nothing is downloaded:

- weights are random, from numpy with a fixed seed;
- the tokenizer is a real byte-level BPE trained with `tokenizers` on ASCII lines of the running
  Python's standard library, so English and code come out at about 3-4 characters per token, like
  the models the monitor is meant for;
- the chat template is ChatML.

The lm_head rows of the special tokens (EOS among them) and of tokens that decode to anything but
printable ASCII are zero, the others large: the model never stops early and never emits half a
UTF-8 character, so every request streams exactly `max_tokens` non-empty text deltas.

Usage: python vllm_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
VOCAB_SIZE = 8192
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 256, 4, 4, 2, 768
CONTEXT = 8192
SEED = 0
CORPUS_BYTES = 6_000_000


def corpus_lines(max_bytes: int) -> Iterator[str]:
    """Non-blank ASCII lines of the standard library's modules, in a fixed order."""
    total = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        for raw in data.splitlines():
            if not raw.strip() or not raw.isascii():
                continue
            total += len(raw) + 1
            yield raw.decode("ascii") + "\n"
            if total >= max_bytes:
                return


def train_tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        # All 256 byte symbols, so any input text tokenizes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(CORPUS_BYTES), trainer)
    return tokenizer


def byte_level_decoder() -> dict[str, int]:
    """GPT-2's bytes-to-unicode table, inverted: the symbol a byte-level token uses for each byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols = list(kept)
    shifted = 0
    for byte in range(256):
        if byte not in kept:
            kept.append(byte)
            symbols.append(256 + shifted)
            shifted += 1
    return {chr(symbol): byte for byte, symbol in zip(kept, symbols, strict=True)}


def printable_tokens(tokens: list[str]) -> np.ndarray:
    """True for the tokens whose bytes are all printable ASCII (or tab, newline); specials excluded."""
    decode = byte_level_decoder()
    allowed = set(range(32, 127)) | {9, 10}
    mask = np.zeros(len(tokens), dtype=bool)
    for index, token in enumerate(tokens):
        if index >= len(SPECIAL_TOKENS):
            mask[index] = all(decode.get(symbol) in allowed for symbol in token)
    return mask


def random_weights(printable: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    head_dim = HIDDEN // HEADS

    def normal(*shape: int, std: float) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    lm_head = normal(len(printable), HIDDEN, std=1.0)
    lm_head[~printable] = 0.0
    weights = {
        "model.embed_tokens.weight": normal(len(printable), HIDDEN, std=1.0),
        "model.norm.weight": np.ones(HIDDEN, np.float32),
        "lm_head.weight": lm_head,
    }
    # 1/sqrt(fan_in): each layer's output is as large as its input, so what the model samples
    # depends on the whole prompt, as in a real model, not only on the last token.
    s_hidden, s_ffn, s_attn = HIDDEN**-0.5, FFN**-0.5, (HEADS * head_dim) ** -0.5
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        weights[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        weights[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        weights[p + "self_attn.q_proj.weight"] = normal(HEADS * head_dim, HIDDEN, std=s_hidden)
        weights[p + "self_attn.k_proj.weight"] = normal(KV_HEADS * head_dim, HIDDEN, std=s_hidden)
        weights[p + "self_attn.v_proj.weight"] = normal(KV_HEADS * head_dim, HIDDEN, std=s_hidden)
        weights[p + "self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * head_dim, std=s_attn)
        weights[p + "mlp.gate_proj.weight"] = normal(FFN, HIDDEN, std=s_hidden)
        weights[p + "mlp.up_proj.weight"] = normal(FFN, HIDDEN, std=s_hidden)
        weights[p + "mlp.down_proj.weight"] = normal(HIDDEN, FFN, std=s_ffn)
    return weights


def model_config(vocab_size: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    }


def tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": CONTEXT,
        "chat_template": CHATML,
    }


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def build(out: Path) -> None:
    from safetensors.numpy import save_file

    tokenizer = train_tokenizer()
    vocab = tokenizer.get_vocab()  # type: ignore[attr-defined]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    if tokens[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
        raise SystemExit(f"special tokens are not ids 0-2: {tokens[:3]}")
    printable = printable_tokens(tokens)
    out.mkdir(parents=True, exist_ok=True)
    save_file(random_weights(printable), str(out / "model.safetensors"), metadata={"format": "pt"})
    write_json(out / "config.json", model_config(len(tokens)))
    write_json(out / "generation_config.json", {"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0})
    tokenizer.save(str(out / "tokenizer.json"))  # type: ignore[attr-defined]
    write_json(out / "tokenizer_config.json", tokenizer_config())
    write_json(out / "special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    (out / "chat_template.jinja").write_text(CHATML)
    print(f"tiny Llama in {out}: vocab {len(tokens)}, {int(printable.sum())} printable output tokens")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: vllm_tiny_model.py OUT_DIR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    build(Path(sys.argv[1]))
