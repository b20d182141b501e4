"""Saving and loading the main Transformer, in our format and as a Hugging Face ELECTRA model.

Our format (every configuration, including relative positions), a directory with:
    config.json   {"format": "electralab-encoder", "version": 1, "vocab_size": V, "encoder": {...}}
    weights.pt    the Encoder's state_dict (torch.save; load with weights_only=True)
    spm.model, tokenizer.json   the run's vocabulary (data/vocab), when given: `Tokenizer(directory)` loads it
Load it with `load_encoder(directory)`.

Hugging Face format (absolute-position configurations): `ElectraModel` weights and config that
`transformers.AutoModel.from_pretrained(directory)` loads; its outputs match ours (token_type_ids
zero: we train without segment embeddings, so the exported token-type table is zeros). Written
without importing transformers, which stays a test/benchmark dependency.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch
from torch import nn

from electralab import PAD_ID
from electralab.config import ConfigError, EncoderConfig, build
from electralab.io import atomic_dir, read_json, write_json
from electralab.model.encoder import Encoder

FORMAT = "electralab-encoder"


VOCAB_FILES = ("spm.model", "spm.vocab", "tokenizer.json")   # what electralab.data.vocab.Tokenizer reads


def copy_vocab(vocab_dir: str | Path | None, directory: Path) -> None:
    """Ship the run's vocabulary with an exported model, so the directory is also a Tokenizer dir."""
    if vocab_dir is None:
        return
    for name in VOCAB_FILES:
        if (Path(vocab_dir) / name).exists():
            shutil.copyfile(Path(vocab_dir) / name, directory / name)


def save_encoder(encoder: Encoder, directory: str | Path, vocab_dir: str | Path | None = None) -> None:
    directory = Path(directory)
    with atomic_dir(directory) as tmp:
        write_json(tmp / "config.json", {"format": FORMAT, "version": 1,
                                         "vocab_size": encoder.embeddings.tokens.num_embeddings,
                                         "encoder": dataclasses.asdict(encoder.cfg)})
        torch.save({k: v.detach().cpu() for k, v in encoder.state_dict().items()}, tmp / "weights.pt")
        copy_vocab(vocab_dir, tmp)


def load_encoder(directory: str | Path, map_location: str | torch.device = "cpu") -> Encoder:
    """The Encoder saved by save_encoder (relative-position configurations included)."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.exists():
        raise ConfigError(f"{directory}: no config.json (not an exported electralab encoder)")
    meta = read_json(config_path)
    if meta.get("format") != FORMAT:
        raise ConfigError(f"{config_path}: format={meta.get('format')!r}, expected {FORMAT!r}")
    cfg = build(EncoderConfig, meta["encoder"], str(config_path))
    encoder = Encoder(cfg, nn.Embedding(meta["vocab_size"], cfg.embedding))
    state = torch.load(directory / "weights.pt", map_location=map_location, weights_only=True)
    encoder.load_state_dict(state)
    return encoder


def huggingface_compatible(cfg: EncoderConfig) -> bool:
    return cfg.absolute_positions and not cfg.relative_positions


def huggingface_config(encoder: Encoder) -> dict:
    cfg, vocab = encoder.cfg, encoder.embeddings.tokens.num_embeddings
    return {
        "model_type": "electra", "architectures": ["ElectraModel"], "vocab_size": vocab,
        "embedding_size": cfg.embedding, "hidden_size": cfg.hidden, "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads, "intermediate_size": cfg.ffn, "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.attention_dropout,
        "max_position_embeddings": cfg.max_positions, "type_vocab_size": 2,
        "initializer_range": cfg.initializer_range, "layer_norm_eps": cfg.layer_norm_eps,
        "position_embedding_type": "absolute", "pad_token_id": PAD_ID,
    }


def huggingface_state_dict(encoder: Encoder) -> dict[str, torch.Tensor]:
    """Our parameter names -> transformers' ElectraModel names."""
    emb, H = encoder.embeddings, encoder.cfg.hidden
    out = {
        "embeddings.word_embeddings.weight": emb.tokens.weight,
        "embeddings.position_embeddings.weight": emb.positions.weight,
        "embeddings.token_type_embeddings.weight": torch.zeros(2, encoder.cfg.embedding),
        "embeddings.LayerNorm.weight": emb.norm.weight,
        "embeddings.LayerNorm.bias": emb.norm.bias,
    }
    if emb.project is not None:
        out["embeddings_project.weight"] = emb.project.weight
        out["embeddings_project.bias"] = emb.project.bias
    for i, layer in enumerate(encoder.layers):
        p = f"encoder.layer.{i}."
        qkv_w, qkv_b = layer.attention.qkv.weight, layer.attention.qkv.bias
        for j, name in enumerate(("query", "key", "value")):
            out[p + f"attention.self.{name}.weight"] = qkv_w[j * H:(j + 1) * H]
            out[p + f"attention.self.{name}.bias"] = qkv_b[j * H:(j + 1) * H]
        out[p + "attention.output.dense.weight"] = layer.attention.out.weight
        out[p + "attention.output.dense.bias"] = layer.attention.out.bias
        out[p + "attention.output.LayerNorm.weight"] = layer.attention_norm.weight
        out[p + "attention.output.LayerNorm.bias"] = layer.attention_norm.bias
        out[p + "intermediate.dense.weight"] = layer.ffn_in.weight
        out[p + "intermediate.dense.bias"] = layer.ffn_in.bias
        out[p + "output.dense.weight"] = layer.ffn_out.weight
        out[p + "output.dense.bias"] = layer.ffn_out.bias
        out[p + "output.LayerNorm.weight"] = layer.ffn_norm.weight
        out[p + "output.LayerNorm.bias"] = layer.ffn_norm.bias
    return {k: v.detach().cpu().clone().contiguous() for k, v in out.items()}


def save_huggingface(encoder: Encoder, directory: str | Path, vocab_dir: str | Path | None = None) -> None:
    """Write a transformers ElectraModel directory (absolute-position configurations only)."""
    if not huggingface_compatible(encoder.cfg):
        raise ConfigError("Hugging Face export needs absolute positions and no relative position bias "
                          "(transformers' ELECTRA has no T5 bias); use save_encoder/load_encoder instead")
    with atomic_dir(directory) as tmp:
        write_json(tmp / "config.json", huggingface_config(encoder))
        torch.save(huggingface_state_dict(encoder), tmp / "pytorch_model.bin")
        copy_vocab(vocab_dir, tmp)
