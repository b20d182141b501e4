"""The Hugging Face export, loaded by transformers as its users load it: `AutoTokenizer` gives our ids on the GLUE
and SQuAD dev sentences of the mirror (cased and uncased, BPE and unigram), and `AutoModel` + `AutoTokenizer` give
our encoder's outputs, for absolute-position encoders (transformers' ElectraModel) and relative-position ones (the
remote code shipped in the export), with SDPA and eager attention. tests/test_flows.py checks the export stage's
output of a trained run (the model card included).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import VOCAB, mirror_root

from electralab.config import EncoderConfig
from electralab.data.vocab import Tokenizer
from electralab.errors import ConfigError
from electralab.export import load_encoder, save_encoder, save_huggingface
from electralab.finetune.features import encode_pairs
from electralab.finetune.tasks import TASKS, MissingSplit, read_split
from electralab.model.encoder import Encoder, make_token_embedding

pytestmark = pytest.mark.usefixtures("single_thread")

# Real text, and what normalisation has to get right: whitespace runs and controls, accents, a word-final
# capital sigma, zero-width and format characters, characters outside the vocabulary, the replacement character.
EDGE_CASES = [
    "  Café\tMÜNCHEN\n",
    "ΟΔΟΣ ΣΟΦΙΑΣ",
    "a\u200bb  c",
    "日本語のテキスト 🤖",
    "x\x01y\x7fz",
    "İstanbul ǅ ﬁ",
    "naïve résumé",
    "\ufffdbroken",
    "a\x1cb\u3000c",
    " ",
    "",
]


def dev_pairs(limit: int = 150) -> list[tuple[str, str | None]]:
    """Sentences (and their pairs) of every GLUE task's dev split in the mirror, and SQuAD 2.0 questions with
    their paragraphs."""
    pairs: list[tuple[str, str | None]] = []
    for task in TASKS.values():
        try:
            split = read_split(task, task.eval_splits[0].name, mirror_root())
        except MissingSplit:  # a split the mirror lacks (QQP's dev)
            continue
        if task.kind == "span":
            pairs += [(e.question, e.context) for e in split.examples[:limit]]
        else:
            b = split.text_b[:limit] if split.text_b is not None else [None] * limit
            pairs += list(zip(split.text_a[:limit], b))
    assert len(pairs) > 6 * limit
    return pairs


@pytest.fixture(scope="module")
def vocabularies(vocab_dir, corpus_dir, corpus_cfg, mirror, tmp_path_factory):
    """The session's uncased BPE vocabulary, a cased BPE one and an uncased unigram one."""
    from electralab.data.corpus import build_corpus
    from electralab.data.vocab import train_vocab

    out = tmp_path_factory.mktemp("vocabularies")
    build_corpus(dataclasses.replace(corpus_cfg, uncased=False), out / "cased-corpus", mirror)
    train_vocab(out / "cased-corpus", out / "cased-bpe", VOCAB)
    train_vocab(corpus_dir, out / "uncased-unigram", dataclasses.replace(VOCAB, model_type="unigram"))
    return {"uncased-bpe": vocab_dir, "cased-bpe": out / "cased-bpe", "uncased-unigram": out / "uncased-unigram"}


def random_encoder(cfg: EncoderConfig, vocab_size: int) -> Encoder:
    torch.manual_seed(0)
    encoder = Encoder(cfg, make_token_embedding(vocab_size, cfg.embedding)).eval()
    with torch.no_grad():  # away from the initialisation: zero biases would hide a misplaced one
        for p in encoder.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return encoder


@pytest.mark.parametrize("kind", ["uncased-bpe", "cased-bpe", "uncased-unigram"])
def test_autotokenizer_gives_our_ids_on_real_sentences(kind, vocabularies, tmp_path):
    from transformers import AutoTokenizer

    cfg = EncoderConfig(hidden=16, layers=1, heads=1, ffn=32, embedding=16, max_positions=512)
    ours = Tokenizer(vocabularies[kind])
    save_huggingface(random_encoder(cfg, ours.vocab_size), tmp_path / "hf", vocab_dir=vocabularies[kind])
    theirs = AutoTokenizer.from_pretrained(tmp_path / "hf")  # as is: no remote code, no arguments

    pairs = dev_pairs() + [(t, None) for t in EDGE_CASES]
    texts = [t for pair in pairs for t in pair if t is not None]
    mismatches = [
        t for t, ids in zip(texts, theirs(texts, add_special_tokens=False)["input_ids"]) if ids != ours.encode(t)
    ]
    assert not mismatches, (len(mismatches), len(texts), mismatches[:3])
    # With the special tokens: exactly the inputs fine-tuning builds ([CLS] a [SEP] b [SEP], no segment ids).
    a, b = [p[0] for p in pairs if p[1]], [p[1] for p in pairs if p[1]]
    encoded = encode_pairs(ours, a, b, np.zeros(len(a)), max_len=100_000)
    batch = theirs(a, b)
    assert set(batch) == {"input_ids", "attention_mask"}
    assert all(
        batch["input_ids"][i] == encoded.ids[encoded.offsets[i] : encoded.offsets[i + 1]].tolist()
        for i in range(len(a))
    )
    assert theirs.decode(theirs("The cat sat.")["input_ids"], skip_special_tokens=True) == ours.decode(
        ours.encode("The cat sat.")
    )


CONFIGS = {  # the presets' default (absolute + relative), relative only with factorised embeddings, absolute only
    "absolute+relative": dict(absolute_positions=True, relative_positions=True),
    "relative, factorised": dict(
        absolute_positions=False, relative_positions=True, embedding=16, relative_buckets=16, relative_max_distance=24
    ),
    "absolute": dict(absolute_positions=True, relative_positions=False, embedding=16),
    # a local start with [CLS] untied from it: its row and column are the two learned scalars, not the bias
    "relative, ALiBi start, untied [CLS]": dict(relative_init="alibi", alibi_heads=8, untie_cls=True),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_automodel_and_autotokenizer_give_our_encoders_outputs(name, vocab_dir, tmp_path):
    from transformers import AutoModel, AutoTokenizer, ElectraModel

    cfg = EncoderConfig(
        **{**dict(hidden=32, layers=3, heads=2, ffn=64, embedding=32, max_positions=512), **CONFIGS[name]}
    )
    ours = Tokenizer(vocab_dir)
    encoder = random_encoder(cfg, ours.vocab_size)
    save_encoder(encoder, tmp_path / "ours", vocab_dir)
    save_huggingface(load_encoder(tmp_path / "ours"), tmp_path / "hf", vocab_dir=tmp_path / "ours")
    remote = cfg.relative_positions
    assert (tmp_path / "hf" / "modeling_electralab.py").exists() == remote
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")

    pairs = dev_pairs(limit=3)
    a, b = [p[0] for p in pairs if p[1]][:6], [p[1] for p in pairs if p[1]][:6]  # up to ~200 tokens: far buckets
    batch = tokenizer(a, b, padding=True, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    assert not mask.all()  # padding in the batch: the mask and the bias combine
    with torch.no_grad():
        expected = encoder(batch["input_ids"], mask)[-1]
        for attention in ("sdpa", "eager"):
            model = AutoModel.from_pretrained(
                tmp_path / "hf", trust_remote_code=remote, attn_implementation=attention
            ).eval()
            assert (type(model).__name__ == "ElectralabModel") == remote and isinstance(model, ElectraModel)
            got = model(**batch).last_hidden_state
            assert torch.allclose(got[mask], expected[mask], atol=1e-5), (attention, (got - expected)[mask].abs().max())


@pytest.mark.parametrize("change", [{"norm": "pre"}, {"qk_norm": True}])
def test_the_transformers_export_refuses_what_electras_layers_cannot_hold_and_writes_nothing(change, tmp_path):
    cfg = EncoderConfig(hidden=32, layers=2, heads=2, ffn=64, embedding=32, max_positions=64, **change)
    encoder = Encoder(cfg, make_token_embedding(50, 32))
    with pytest.raises(ConfigError, match=f"{next(iter(change))}=") as error:
        save_huggingface(encoder, tmp_path / "hf")
    assert str(tmp_path / "hf") in str(error.value) and not (tmp_path / "hf").exists()
    save_encoder(encoder, tmp_path / "ours")  # our own format holds it, and loads it back
    torch.testing.assert_close(load_encoder(tmp_path / "ours").state_dict(), encoder.state_dict())


def truncated(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def resized_first_tensor(path):
    state = torch.load(path, weights_only=True)
    state[next(iter(state))] = torch.zeros(3, 3)
    torch.save(state, path)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda m, s: truncated(m / "encoder" / "config.json"), "encoder/config.json: not readable JSON"),
        (lambda m, s: (m / "encoder" / "config.json").write_text("[]"), "encoder/config.json: format='list'"),
        (lambda m, s: truncated(m / "encoder" / "weights.pt"), "encoder/weights.pt: does not load"),
        (lambda m, s: resized_first_tensor(m / "encoder" / "weights.pt"), "encoder/weights.pt: does not fit"),
        (lambda m, s: s.write_text("[1, 2]"), "metrics/finetune/mlm.json: expected a JSON object, got list"),
        (lambda m, s: truncated(s), "metrics/finetune/mlm.json: not a readable manifest"),
    ],
    ids=[
        "config-truncated",
        "config-a-list",
        "weights-truncated",
        "weights-wrong-shape",
        "scores-a-list",
        "scores-cut",
    ],
)
def test_a_damaged_model_or_metrics_file_stops_the_export_in_one_line_and_writes_nothing(
    damage, message, vocab_dir, tmp_path, monkeypatch, capsys
):
    from conftest import ROOT
    from project_helpers import load_stage, stage_args
    from report_helpers import tiny_encoder

    from electralab.cli import run_stage
    from electralab.io import write_json

    root = tmp_path / "project"
    model, scores = root / "models" / "mlm", root / "metrics" / "finetune" / "mlm.json"
    save_encoder(tiny_encoder(Tokenizer(vocab_dir).vocab_size, 0), model / "encoder", vocab_dir)
    write_json(model / "summary.json", {"steps": 8, "wall_hours": 0.1, "device_hours": 0.1, "mlflow_run_id": "r"})
    write_json(scores, {"rte": {"accuracy": 50.0}, "missing": {}})
    (root / "params.yaml").write_bytes((ROOT / "params.yaml").read_bytes())
    damage(model, scores)
    monkeypatch.chdir(root)
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    stage = load_stage("export")
    with pytest.raises(SystemExit) as exited:
        run_stage("export", stage.main, ["--params", "params.yaml", *stage_args("export", "mlm")[1:]], stage.arguments)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err and not (root / "exports").exists()


def test_the_model_card_says_which_tasks_ran_without_a_median_and_names_its_run():
    from conftest import ROOT

    from electralab.card import model_card
    from electralab.config import load_params
    from electralab.runs import resolve_run

    run = resolve_run(load_params(ROOT / "params.yaml"), "mlm")
    summary = {"steps": 8000, "wall_hours": 1.0}
    none_yet = model_card(run, "tiny preset", summary, {}, 5, None, False)
    assert "`dvc repro finetune@mlm`, then `dvc repro export@mlm`" in none_yet and "<run>" not in none_yet
    scores = {"rte": {"accuracy": 55.0}, "stsb": {"pearson": None, "spearman": None}, "missing": {}}
    card = model_card(run, "tiny preset", summary, scores, 5, None, False)
    assert "| RTE | 55.0 |" in card
    assert "| STS-B | — (fine-tuned; no median: a seed gave no score (docs/finetuning.md)) |" in card
    assert "| MNLI-m | — (not fine-tuned) |" in card
