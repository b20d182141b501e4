"""Saving and loading the main Transformer, in our format and as a Hugging Face model.

Our format (every configuration, including relative positions), a directory with:
    config.json   {"format": "electralab-encoder", "version": 1, "vocab_size": V, "encoder": {...}}
    weights.pt    the Encoder's state_dict (torch.save; load with weights_only=True)
    spm.model, electralab_tokenizer.json   the run's vocabulary (data/vocab), when given: `Tokenizer(directory)`
Load it with `load_encoder(directory)`.

Hugging Face format (`save_huggingface`; the export stage writes it to exports/<run>/), for every run:
    absolute positions only  transformers' own `ElectraModel`: `AutoModel.from_pretrained(directory)`
    relative position bias   `ElectraModel` plus the bias, in modeling_electralab.py shipped in the directory
                             (config.json's auto_map): `AutoModel.from_pretrained(directory, trust_remote_code=True)`
with the vocabulary as a tokenizer `AutoTokenizer.from_pretrained(directory)` loads (data/hf_tokenizer.py).
Outputs match ours with token_type_ids zero (we train without segment embeddings: the exported token-type
table is zeros, and the tokenizer returns no segment ids). Written without importing transformers, which
stays a test/benchmark dependency.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch
from torch import nn

from electralab import PAD_ID
from electralab.config import EncoderConfig, build
from electralab.data.vocab import MODEL_FILE, TOKENIZER_FILE, VOCAB_FILE
from electralab.errors import ConfigError, DataError
from electralab.io import atomic_dir, read_json, write_json
from electralab.model.encoder import Encoder

FORMAT = "electralab-encoder"


VOCAB_FILES = (MODEL_FILE, VOCAB_FILE, TOKENIZER_FILE)  # what electralab.data.vocab.Tokenizer reads
REMOTE_CODE = Path(__file__).with_name("modeling_electralab.py")  # copied into relative-position exports


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
        write_json(
            tmp / "config.json",
            {
                "format": FORMAT,
                "version": 1,
                "vocab_size": encoder.embeddings.tokens.num_embeddings,
                "encoder": dataclasses.asdict(encoder.cfg),
            },
        )
        torch.save({k: v.detach().cpu() for k, v in encoder.state_dict().items()}, tmp / "weights.pt")
        copy_vocab(vocab_dir, tmp)


def load_encoder(directory: str | Path, map_location: str | torch.device = "cpu") -> Encoder:
    """The Encoder saved by save_encoder (relative-position configurations included)."""
    directory = Path(directory)
    config_path, weights = directory / "config.json", directory / "weights.pt"
    if not config_path.exists():
        raise ConfigError(f"{directory}: no config.json (not an exported electralab encoder)")
    try:
        meta = read_json(config_path)
    except ValueError as e:  # truncated, overwritten, not UTF-8
        raise DataError(f"{config_path}: not readable JSON ({e}); train its run again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ConfigError(f"{config_path}: format={found!r}, expected {FORMAT!r}")
    if not isinstance(meta.get("encoder"), dict) or not isinstance(meta.get("vocab_size"), int):
        raise DataError(
            f"{config_path}: needs `encoder` (an object) and `vocab_size` (an integer); train its run again"
        )
    cfg = build(EncoderConfig, meta["encoder"], str(config_path))
    encoder = Encoder(cfg, nn.Embedding(meta["vocab_size"], cfg.embedding))
    try:
        state = torch.load(weights, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise DataError(f"{weights}: no such file; train its run again") from None
    except Exception as e:  # truncated, not a torch file, not plain tensors
        raise DataError(f"{weights}: does not load ({type(e).__name__}: {str(e)[:200]}); train its run again") from None
    try:
        encoder.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as e:  # missing or unexpected keys, wrong shapes, not a dict
        first = str(e).strip().splitlines()
        raise DataError(
            f"{weights}: does not fit {config_path} ({' '.join(first[:2])[:300]}); train its run again"
        ) from None
    return encoder


def huggingface_compatible(cfg: EncoderConfig) -> bool:
    """Whether transformers' own ElectraModel holds this encoder (no remote code needed)."""
    return cfg.absolute_positions and not cfg.relative_positions


def huggingface_fields(cfg: EncoderConfig, vocab_size: int) -> dict:
    """transformers' ELECTRA (or BERT, less `embedding_size`) config fields of an encoder of ours, absolute
    positions: the one mapping the export, the parity bench and the peer benches share."""
    return {
        "vocab_size": vocab_size,
        "embedding_size": cfg.embedding,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "intermediate_size": cfg.ffn,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "max_position_embeddings": cfg.max_positions,
        "type_vocab_size": 2,
        "initializer_range": cfg.initializer_range,
        "layer_norm_eps": cfg.layer_norm_eps,
        "position_embedding_type": "absolute",
        "pad_token_id": PAD_ID,
    }


def huggingface_config(encoder: Encoder) -> dict:
    cfg, vocab = encoder.cfg, encoder.embeddings.tokens.num_embeddings
    config = {
        "model_type": "electra",
        "architectures": ["ElectraModel"],
        **huggingface_fields(cfg, vocab),
    }
    if not huggingface_compatible(cfg):
        module = REMOTE_CODE.stem
        # model_type stays "electra" so that AutoConfig/AutoTokenizer load without remote code (modeling_electralab.py)
        config.update(
            architectures=["ElectralabModel"],
            relative_buckets=cfg.relative_buckets,
            relative_max_distance=cfg.relative_max_distance,
            untie_cls=cfg.untie_cls,
            auto_map={"AutoConfig": f"{module}.ElectralabConfig", "AutoModel": f"{module}.ElectralabModel"},
        )
    return config


def huggingface_state_dict(encoder: Encoder) -> dict[str, torch.Tensor]:
    """Our parameter names -> transformers' ElectraModel names (+ the relative bias of ElectralabModel)."""
    emb, cfg, H = encoder.embeddings, encoder.cfg, encoder.cfg.hidden
    out = {
        "embeddings.word_embeddings.weight": emb.tokens.weight,
        # ELECTRA always adds a position table: zeros add nothing where we train without one.
        "embeddings.position_embeddings.weight": (
            emb.positions.weight if emb.positions is not None else torch.zeros(cfg.max_positions, cfg.embedding)
        ),
        "embeddings.token_type_embeddings.weight": torch.zeros(2, cfg.embedding),
        "embeddings.LayerNorm.weight": emb.norm.weight,
        "embeddings.LayerNorm.bias": emb.norm.bias,
    }
    if emb.project is not None:
        out["embeddings_project.weight"] = emb.project.weight
        out["embeddings_project.bias"] = emb.project.bias
    if encoder.relative_bias is not None:
        out["relative_attention_bias.weight"] = encoder.relative_bias.bias.weight
        if encoder.relative_bias.cls is not None:
            out["relative_attention_bias_cls"] = encoder.relative_bias.cls
    for i, layer in enumerate(encoder.layers):
        p = f"encoder.layer.{i}."
        qkv_w, qkv_b = layer.attention.qkv.weight, layer.attention.qkv.bias
        for j, name in enumerate(("query", "key", "value")):
            out[p + f"attention.self.{name}.weight"] = qkv_w[j * H : (j + 1) * H]
            out[p + f"attention.self.{name}.bias"] = qkv_b[j * H : (j + 1) * H]
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


def save_huggingface(
    encoder: Encoder, directory: str | Path, vocab_dir: str | Path | None = None, card: str | None = None
) -> None:
    """Write a transformers model directory (see the module docstring): config, weights, the remote code for a
    relative-position encoder, the tokenizer files when `vocab_dir` is given, and `card` as README.md."""
    cfg = encoder.cfg
    if cfg.norm != "post" or cfg.qk_norm:  # before anything is written: no partial export
        raise ConfigError(
            f"{directory}: the transformers export holds post-LN encoders without QK-norm (ELECTRA's layers); "
            f"this one has norm={cfg.norm!r}, qk_norm={cfg.qk_norm}. Its encoder/ directory loads with "
            f"electralab.export.load_encoder"
        )
    with atomic_dir(directory) as tmp:
        write_json(tmp / "config.json", huggingface_config(encoder))
        torch.save(huggingface_state_dict(encoder), tmp / "pytorch_model.bin")
        if not huggingface_compatible(encoder.cfg):
            shutil.copyfile(REMOTE_CODE, tmp / REMOTE_CODE.name)
        if vocab_dir is not None:
            from electralab.data.hf_tokenizer import save_hf_tokenizer

            save_hf_tokenizer(vocab_dir, tmp, max_length=encoder.cfg.max_positions)
        if card is not None:
            (tmp / "README.md").write_text(card, encoding="utf-8")
