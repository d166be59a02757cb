"""Example model: a small pre-norm transformer language model written from scratch.

Structure (module paths as in ``named_modules()``)::

    embed               nn.Embedding(vocab, d_model), token embedding
    pos                 nn.Embedding(max_seq, d_model), learned positions
    drop                nn.Dropout after the embeddings
    blocks              nn.ModuleList of Block, children 0..3
    blocks.N.ln1        nn.LayerNorm
    blocks.N.attn       SelfAttention (qkv, attn_drop, proj, resid_drop)
    blocks.N.ln2        nn.LayerNorm
    blocks.N.mlp        MLP (fc1, act = nn.GELU, fc2, drop)
    norm                nn.LayerNorm (final)
    head                nn.Linear(d_model, vocab), the LM head

``forward(ids, attention_mask=None)`` takes token ids ``(batch, seq)`` and an
optional ``(batch, seq)`` mask of tokens to attend to (1/True keep, 0/False pad);
attention is causal.  The mask is passed to every block as a keyword argument.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from memoplan.specs import Example

VOCAB = 100
D_MODEL = 64
N_HEADS = 4
N_BLOCKS = 4
MAX_SEQ = 64
BATCH = 4
SEQ = 32


class SelfAttention(nn.Module):
    """Causal multi-head self-attention with attention and residual dropout."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.1) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.proj = nn.Linear(d_model, d_model)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, d_model = x.shape
        head_dim = d_model // self.n_heads
        # (batch, seq, 3 * d_model) -> three of (batch, heads, seq, head_dim)
        q, k, v = self.qkv(x).view(batch, seq, 3, self.n_heads, head_dim).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        allowed = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()[:, None, None, :]
        # A large negative number rather than -inf keeps fully masked rows finite.
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = self.attn_drop(F.softmax(scores, dim=-1))
        out = (weights @ v).transpose(1, 2).reshape(batch, seq, d_model)
        return self.resid_drop(self.proj(out))


class MLP(nn.Module):
    """Linear -> GELU -> Linear -> Dropout, with a 4x hidden width."""

    def __init__(self, d_model: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), attention_mask=attention_mask)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Token and position embeddings, ``Block``s, final LayerNorm and an LM head."""

    def __init__(
        self,
        vocab: int = VOCAB,
        d_model: int = D_MODEL,
        n_heads: int = N_HEADS,
        n_blocks: int = N_BLOCKS,
        max_seq: int = MAX_SEQ,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_seq, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, dropout) for _ in range(n_blocks))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.embed(ids) + self.pos(positions))
        for block in self.blocks:
            x = block(x, attention_mask=attention_mask)
        return self.head(self.norm(x))


def build() -> nn.Module:
    return Transformer()


def example(batch: int = BATCH, seq: int = SEQ) -> tuple[torch.Tensor]:
    """Token ids, shape ``(batch, seq)``, int64 in ``[0, VOCAB)``."""
    return (torch.randint(0, VOCAB, (batch, seq)),)


def example_with_mask(batch: int = BATCH, seq: int = SEQ) -> Example:
    """Token ids plus an ``attention_mask`` keyword argument (the last quarter of row 0 is padding).

    Returns a :class:`memoplan.specs.Example`, so it also works as an example SPEC
    (``memoplan.examples.transformer:example_with_mask``).
    """
    (ids,) = example(batch, seq)
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[0, seq - seq // 4 :] = False
    return Example((ids,), {"attention_mask": mask})
