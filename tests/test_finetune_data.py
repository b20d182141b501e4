"""Task data: the GLUE TSV and SQuAD JSON readers on the real files of the offline mirror (counts,
labels, the CoLA/MRPC quirks, the missing QQP dev split), the hub's row layout, [CLS] a [SEP] b [SEP]
encoding with the project's sentencepiece Tokenizer, batching, SQuAD 2.0 windows and decoding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import ROOT, mirror_root

from electralab import CLS_ID, PAD_ID, SEP_ID
from electralab.config import SquadSettings, load_params
from electralab.data.vocab import Tokenizer
from electralab.errors import DataError
from electralab.finetune import features as F
from electralab.finetune.data import TaskData, prepare
from electralab.finetune.metrics import squad_metrics
from electralab.finetune.squad import decode, max_context, split_words, squad_windows, word_pieces
from electralab.finetune.tasks import (
    TASKS,
    MissingSplit,
    glue_from_hub_rows,
    read_glue_tsv,
    read_split,
    squad_from_hub_rows,
)

MIRROR = mirror_root()

# (task, split): rows, label counts in label-id order (../shared/data/SOURCES.md and PROVENANCE.md)
GLUE_COUNTS = {
    ("cola", "train"): (8551, None),
    ("cola", "dev"): (1043, (322, 721)),
    ("sst2", "train"): (67349, None),
    ("sst2", "dev"): (872, (428, 444)),
    ("mrpc", "train"): (3668, (1194, 2474)),
    ("mrpc", "dev"): (408, (129, 279)),
    ("stsb", "train"): (5749, None),
    ("stsb", "dev"): (1500, None),
    ("rte", "train"): (2490, None),
    ("rte", "dev"): (277, (146, 131)),
    ("qnli", "train"): (320, (160, 160)),
    ("qnli", "dev"): (5463, (2702, 2761)),
    ("qqp", "train"): (320, (160, 160)),
    ("mnli", "train"): (480, (160, 160, 160)),
    ("mnli", "dev_matched"): (9815, (3479, 3123, 3213)),  # entailment, neutral, contradiction
    ("mnli", "dev_mismatched"): (9832, (3463, 3129, 3240)),
}


@pytest.mark.parametrize("task,split", list(GLUE_COUNTS))
def test_glue_tsv_counts_and_labels(task, split):
    rows, label_counts = GLUE_COUNTS[(task, split)]
    data = read_split(TASKS[task], split, MIRROR)
    assert len(data) == len(data.text_a) == len(data.labels) == rows
    assert (data.text_b is None) == (task in ("cola", "sst2"))
    if task == "stsb":
        assert data.labels.dtype == np.float32 and data.labels.min() == 0.0 and data.labels.max() == 5.0
    elif label_counts is not None:
        assert tuple(np.bincount(data.labels, minlength=len(TASKS[task].labels))) == label_counts
    assert all(t.strip() for t in data.text_a)


def test_cola_has_no_header_and_its_dev_file_no_final_newline():
    path = MIRROR / "glue" / "CoLA" / "dev.tsv"
    assert not path.read_bytes().endswith(b"\n")
    dev = read_glue_tsv(TASKS["cola"], path)
    assert (dev.text_a[0], dev.labels[0]) == ("The sailors rode the breeze clear of the rocks.", 1)
    last = path.read_text(encoding="utf-8").split("\n")[-1].split("\t")
    assert (dev.text_a[-1], dev.labels[-1]) == (last[3], int(last[1]))


def test_mrpc_byte_order_mark_header_and_bare_quotes():
    assert (MIRROR / "glue" / "MRPC" / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality\t")
    train = read_split(TASKS["mrpc"], "train", MIRROR)
    assert train.labels[0] == 1
    assert train.text_a[0] == (
        'Amrozi accused his brother , whom he called " the witness " , of deliberately distorting his evidence .'
    )
    qnli = read_split(TASKS["qnli"], "dev", MIRROR)  # 13 QNLI dev sentences start with a bare quote
    assert sum(s.startswith('" ') for s in qnli.text_b) == 13


def test_missing_split_names_the_file():
    with pytest.raises(MissingSplit, match=r"^no dev split: glue/QQP/dev\.tsv is not in the ELECTRALAB_DATA mirror$"):
        read_split(TASKS["qqp"], "dev", MIRROR)


def test_malformed_rows_name_file_line_and_value(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly two\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"dev\.tsv:3: 2 tab-separated fields, rte needs at least 4"):
        read_glue_tsv(TASKS["rte"], path)
    path.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"dev\.tsv:2: label 'maybe' is not one of \['entailment', 'not_entailment'\]"):
        read_glue_tsv(TASKS["rte"], path)


def test_squad_json_counts():
    dev = read_split(TASKS["squad2"], "dev", MIRROR)
    assert len(dev) == 11873 and sum(e.has_answer for e in dev.examples) == 5928
    assert len({e.qid for e in dev.examples}) == 11873
    train = read_split(TASKS["squad2"], "train", MIRROR)
    assert len(train) == 4719 and sum(not e.has_answer for e in train.examples) == 348
    for e in train.examples:
        if e.has_answer:
            assert e.context[e.answer_start : e.answer_start + len(e.answers[0])] == e.answers[0]


def test_hub_rows_give_the_same_layout():
    import datasets

    rows = datasets.Dataset.from_dict(
        {"premise": ["A man eats."], "hypothesis": ["Someone eats."], "label": [0], "idx": [0]}
    ).to_dict()
    mnli = glue_from_hub_rows(TASKS["mnli"], rows, "nyu-mll/glue/mnli:validation_matched")
    assert (mnli.text_a, mnli.text_b, mnli.labels.tolist()) == (["A man eats."], ["Someone eats."], [0])
    with pytest.raises(DataError, match="labels outside"):
        glue_from_hub_rows(TASKS["mnli"], {**rows, "label": [-1]}, "test split")
    squad = squad_from_hub_rows(
        {
            "id": ["a", "b"],
            "question": ["Who?", "What?"],
            "context": ["Rollo did.", "x"],
            "answers": [{"text": ["Rollo"], "answer_start": [0]}, {"text": [], "answer_start": []}],
        },
        "rajpurkar/squad_v2:validation",
    )
    assert [(e.answers, e.answer_start) for e in squad.examples] == [(("Rollo",), 0), ((), None)]


def test_hub_unreachable_is_a_missing_split():
    # conftest sets HF_HUB_OFFLINE / HF_DATASETS_OFFLINE: the hub is unreachable here
    with pytest.raises(MissingSplit, match="nyu-mll/glue/rte:validation could not be loaded"):
        read_split(TASKS["rte"], "dev", None)


# --- encoding and batching ----------------------------------------------------------------------------


def bert_truncate(a: int, b: int, budget: int) -> tuple[int, int]:
    """BERT's _truncate_seq_pair, on lengths."""
    while a + b > budget:
        if a > b:
            a -= 1
        else:
            b -= 1
    return a, b


def test_truncation_is_berts_longest_first():
    for a in range(0, 30):
        for b in range(0, 30):
            for budget in (0, 1, 7, 20, 40):
                assert F.truncate_pair(a, b, budget) == bert_truncate(a, b, budget), (a, b, budget)


def test_pairs_are_cls_a_sep_b_sep_with_the_runs_tokenizer(vocab_dir):
    tok = Tokenizer(vocab_dir)
    a, b = ["The cat sat on the mat.", "A much longer first sentence " * 20], ["It sat.", "Short."]
    enc = F.encode_pairs(tok, a, b, np.array([1, 0]), max_len=32)
    first = enc.ids[enc.offsets[0] : enc.offsets[1]].tolist()
    assert first == [CLS_ID, *tok.encode(a[0]), SEP_ID, *tok.encode(b[0]), SEP_ID]
    assert enc.lengths[1] == 32 and enc.ids[enc.offsets[2] - 1] == SEP_ID
    single = F.encode_pairs(tok, a, None, np.array([1, 0]), max_len=16)
    assert single.ids[: single.offsets[1]].tolist() == [CLS_ID, *tok.encode(a[0])[:14], SEP_ID][: single.lengths[0]]
    assert single.lengths.max() == 16


def test_dynamic_padding_and_fixed_padding():
    enc = F.pack([[2, 5, 3], [2, 5, 6, 7, 3], [2, 3]], np.array([0, 1, 0]))
    ids, mask, labels = enc.batch(np.array([0, 2]))
    assert ids.tolist() == [[2, 5, 3], [2, 3, PAD_ID]] and mask.tolist() == [[True] * 3, [True, True, False]]
    assert labels.tolist() == [0, 0]
    ids, mask, _ = enc.batch(np.array([1]), pad_to=8)
    assert ids.shape == (1, 8) and int(mask.sum()) == 5


def test_batches_cover_every_example_once_and_grouping_cuts_padding():
    lengths = np.random.default_rng(0).integers(5, 200, 5000)
    for group in (False, True):
        batches = F.train_batches(lengths, 32, np.random.default_rng(1), group)
        assert sorted(np.concatenate(batches).tolist()) == list(range(5000))
        again = F.train_batches(lengths, 32, np.random.default_rng(1), group)
        assert all((x == y).all() for x, y in zip(batches, again))  # the seed fixes the order
    padded = {
        g: sum(lengths[b].max() * len(b) for b in F.train_batches(lengths, 32, np.random.default_rng(1), g))
        for g in (False, True)
    }
    assert padded[True] < 0.7 * padded[False]
    evals = F.eval_batches(lengths, 100)
    assert sorted(np.concatenate(evals).tolist()) == list(range(5000))


def test_caps_and_label_fractions_are_fixed_nested_subsets(vocab_dir):
    cfg = dataclasses.replace(
        load_params(ROOT / "params.yaml").presets["tiny"].finetune, max_train_examples=100, max_eval_examples=50
    )
    tok = Tokenizer(vocab_dir)
    data = prepare(TASKS["mnli"], tok, cfg, MIRROR, (1.0, 0.01, 0.1))
    assert data[1.0].counts == {
        "num_train_available": 480,
        "num_train_examples": 100,
        "num_train_skipped": 0,
        "num_eval_available": 9815,
        "num_eval_examples": 50,
        "num_eval_available_mm": 9832,
        "num_eval_examples_mm": 50,
    }
    assert [len(data[f].train) for f in (0.01, 0.1)] == [5, 48]
    rows = lambda enc: {tuple(enc.ids[enc.offsets[i] : enc.offsets[i + 1]]) for i in range(len(enc))}  # noqa: E731
    assert rows(data[0.01].train) <= rows(data[0.1].train) <= rows(data[1.0].train)
    assert data[0.01].evals is data[1.0].evals
    again = prepare(TASKS["mnli"], tok, cfg, MIRROR, (1.0,))[1.0]
    assert again.fingerprint == data[1.0].fingerprint


# --- SQuAD 2.0 windows ---------------------------------------------------------------------------------


def bert_is_max_context(spans: list[tuple[int, int]], index: int, position: int) -> bool:
    """BERT's run_squad._check_is_max_context, verbatim in logic."""
    best_score, best_index = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, i
    return index == best_index


def test_max_context_matches_bert():
    spans = [(0, 10), (4, 10), (8, 10), (12, 5)]
    ours = max_context([s for s, _ in spans], [n for _, n in spans])
    for i, (start, length) in enumerate(spans):
        assert ours[i].tolist() == [bert_is_max_context(spans, i, start + k) for k in range(length)]


def test_words_and_piece_offsets(vocab_dir):
    tok = Tokenizer(vocab_dir)
    assert split_words("  The Normans\u202f(Norman: Nourmands)\n") == [
        (2, "The"),
        (6, "Normans"),
        (14, "(Norman:"),
        (23, "Nourmands)"),
    ]
    for word in ("Normans", "(Norman:", "Beyoncé", "İstanbul"):
        pieces = word_pieces(tok, word)
        assert [p for p, _, _ in pieces] == tok.encode(word)
        assert pieces[0][1] == 0 and pieces[-1][2] == len(word)
        assert all(a <= b for _, a, b in pieces)


def test_gold_spans_decode_to_the_gold_answers(vocab_dir):
    """Windows of real dev questions whose labels are turned into logits decode to the gold answers:
    the windows, the character maps, max-context and n-best decoding agree."""
    tok = Tokenizer(vocab_dir)
    dev = read_split(TASKS["squad2"], "dev", MIRROR)
    examples = dev.examples[:300]
    cfg = SquadSettings(doc_stride=32, max_query_len=16, max_answer_len=40)
    windows = squad_windows(tok, examples, 64, cfg, train=False)
    assert len(windows.encoded) > 2 * len(examples)  # long contexts: several windows each
    assert windows.encoded.lengths.max() <= 64
    starts, ends = [], []
    for i in range(len(windows.encoded)):
        s, e = np.zeros(windows.encoded.lengths[i]), np.zeros(windows.encoded.lengths[i])
        a, b = windows.encoded.labels[i]
        s[a] += 10 if a else 1
        e[b] += 10 if b else 1
        starts.append(s)
        ends.append(e)
    predictions = decode(windows, starts, ends, cfg)
    scores = squad_metrics({x.qid: x.answers for x in examples}, predictions)
    assert scores["no_ans_exact"] == 100.0
    # A few answers cannot come back: longer than max_answer_len, or starting at a token whose
    # most-context window does not hold the whole answer (BERT's rule; 64-token windows make it common).
    assert scores["has_ans_exact"] >= 97.0
    # training windows: unanswerable questions and windows without the answer point at [CLS]
    train = squad_windows(tok, examples, 64, cfg, train=True)
    labels = train.encoded.labels
    assert ((labels[:, 0] == 0) == (labels[:, 1] == 0)).all() and (labels[:, 1] >= labels[:, 0]).all()
    impossible = {i for i, x in enumerate(examples) if not x.has_answer}
    assert all((labels[train.example == i] == 0).all() for i in impossible)


def test_a_zero_width_best_span_gives_the_best_non_empty_span_not_no_answer(vocab_dir):
    """A piece that covers no character (a lone "▁" before punctuation) as both start and end of the
    best-scoring span: the answer is the best span that covers text, as BERT's post-processing gives,
    not "" (the null score lost)."""
    from electralab.finetune.tasks import SquadExample

    tok = Tokenizer(vocab_dir)
    context = "The Normans ( Norman : Nourmands ) gave their name to Normandy ."
    example = SquadExample(
        qid="q", question="Who gave their name?", context=context, answers=("The Normans",), answer_start=0
    )
    cfg = SquadSettings(doc_stride=32, max_query_len=16, max_answer_len=30)
    windows = squad_windows(tok, [example], 64, cfg, train=False)
    first, last = windows.char_start[0], windows.char_end[0]
    empty = np.flatnonzero((first >= 0) & (last == first))
    assert len(empty), "no zero-width piece in this context: pick another one"
    n = windows.encoded.lengths[0]
    start, end = np.zeros(n), np.zeros(n)
    start[empty[0]] = end[empty[0]] = 9.0  # the best span covers no character
    answer = np.flatnonzero(first == 0)[0]  # "The ...": the best span with text
    start[answer], end[answer + 1] = 5.0, 5.0
    start[0] = end[0] = 1.0  # the null score loses by far
    prediction = decode(windows, [start], [end], cfg)["q"]
    assert prediction != "" and context.startswith(prediction)


def test_a_missing_squad_prediction_is_an_error_not_a_smaller_denominator():
    with pytest.raises(ValueError, match=r"SQuAD: 1 of 2 questions have no prediction \(first: q2\)"):
        squad_metrics({"q1": ("Rollo",), "q2": ("x",)}, {"q1": "rollo"})


def test_a_trials_work_counts_trained_tokens_thrice_and_every_evaluation():
    train = F.pack([[1, 2, 3], [1, 2, 3, 4, 5]], np.array([0, 1]))  # 8 tokens
    dev = F.pack([[1, 2, 3, 4]], np.array([1]))  # 4 tokens, in each of MNLI's two dev splits
    data = TaskData(TASKS["mnli"], train, [(split, dev) for split in TASKS["mnli"].eval_splits])
    assert data.trial_work(epochs=3, evaluations=1) == 3 * 3 * 8 + 2 * 4
    assert data.trial_work(epochs=3, evaluations=3) == 3 * 3 * 8 + 3 * 2 * 4
