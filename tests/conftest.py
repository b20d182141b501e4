"""Shared fixtures: small slices of the real offline mirror (../shared/data), made at test time.

The mirror is $ELECTRALAB_DATA when set, else ../shared/data beside the checkout. Session-scoped
fixtures build a slice of it, then the corpus, a small vocabulary and shards from that slice once; tests
that need to break or change something copy them into their own tmp_path.
"""

from __future__ import annotations

import os
from pathlib import Path

# Under `make test`'s two workers (pytest-xdist) each worker, and every stage it starts, trains on one thread: two
# workers of two threads each on 2 cores oversubscribe them, and OpenMP's spinning threads then slow every step many
# times over. A value the caller set wins; tests that check the thread count set their own.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("ELECTRALAB_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# Fail fast instead of waiting on the unreachable hub (datasets reads these at import).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# A relative mirror (CI's ELECTRALAB_DATA=../shared/data) is the one beside the checkout pytest ran in, made absolute
# once: tests that point DVC_ROOT at a project copy, as DVC does for a stage, must not move it with them.
if os.environ.get("ELECTRALAB_DATA") and not os.path.isabs(os.environ["ELECTRALAB_DATA"]):
    os.environ["ELECTRALAB_DATA"] = os.path.abspath(os.environ["ELECTRALAB_DATA"])

import pytest  # noqa: E402

from electralab.config import CorpusConfig, MirrorSource, ShardsConfig, StaticMaskingConfig, VocabConfig  # noqa: E402
from electralab.env import data_root  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WIKITEXT = "wikitext-2-raw_test_nonblank.txt"
ENWIKI = "enwiki_good_articles_sample.txt"


def mirror_root() -> Path:
    root = data_root() or (ROOT / "../shared/data").resolve()
    if not (root / "corpus" / WIKITEXT).is_file():
        pytest.exit(
            f"{root}/corpus/{WIKITEXT}: the offline mirror is missing; set ELECTRALAB_DATA or "
            f"put ../shared/data beside the checkout",
            returncode=2,
        )
    return root


def slice_articles(src: Path, dst: Path, articles: int, fmt: str) -> None:
    """Copy the first `articles` documents of a mirror file (format "paragraphs" or "wikitext")."""
    seen = 0
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for line in f:
            s = line.strip()
            if fmt == "wikitext" and s.startswith("= ") and not s.startswith("= ="):
                seen += 1
                if seen > articles:
                    break
            out.write(line)
            if fmt == "paragraphs" and not s:
                seen += 1
                if seen == articles:
                    break


@pytest.fixture(scope="session")
def mirror(tmp_path_factory) -> Path:
    """A mirror with 14 WikiText articles and 30 Wikipedia "good articles" (about 0.8 MB)."""
    root = mirror_root()
    out = tmp_path_factory.mktemp("mirror")
    (out / "corpus").mkdir()
    slice_articles(root / "corpus" / WIKITEXT, out / "corpus" / WIKITEXT, 14, "wikitext")
    slice_articles(root / "corpus" / ENWIKI, out / "corpus" / ENWIKI, 30, "paragraphs")
    return out


@pytest.fixture(scope="session")
def corpus_cfg() -> CorpusConfig:
    return CorpusConfig(
        hub=(),
        mirror=(MirrorSource(WIKITEXT, "wikitext"), MirrorSource(ENWIKI, "paragraphs")),
        uncased=True,
        shard_documents=20,
    )


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory, mirror, corpus_cfg) -> Path:
    from electralab.data.corpus import build_corpus

    out = tmp_path_factory.mktemp("built") / "corpus"
    build_corpus(corpus_cfg, out, mirror)
    return out


VOCAB = VocabConfig(size=1000, input_sentence_size=1000, threads=2, seed=1)


@pytest.fixture(scope="session")
def vocab_dir(tmp_path_factory, corpus_dir) -> Path:
    from electralab.data.vocab import train_vocab

    out = tmp_path_factory.mktemp("built") / "vocab"
    train_vocab(corpus_dir, out, VOCAB)
    return out


SHARDS = ShardsConfig(seq_len=64, validation_fraction=0.1, blocks_per_shard=1000, workers=2, seed=1)


@pytest.fixture(scope="session")
def shards_dir(tmp_path_factory, corpus_dir, vocab_dir) -> Path:
    from electralab.data.shards import build_shards

    out = tmp_path_factory.mktemp("built") / "shards"
    build_shards(corpus_dir, vocab_dir, out, SHARDS)
    return out


@pytest.fixture(scope="session")
def static_shards_dir(tmp_path_factory, corpus_dir, vocab_dir) -> Path:
    import dataclasses

    from electralab.data.shards import build_shards

    out = tmp_path_factory.mktemp("built") / "static-shards"
    cfg = dataclasses.replace(SHARDS, static_masking=StaticMaskingConfig(duplication=2))
    build_shards(corpus_dir, vocab_dir, out, cfg)
    return out


# The fixtures that start a server (Prefect, the MLflow UI, Ray, a browser) or run a project's stages as processes:
# a test that uses one is marked `pipeline`, and `make test-fast` (-m "not slow and not pipeline") leaves it out.
PIPELINE_FIXTURES = {
    "prefect_api",
    "prefect_server",
    "ablation",
    "local_ray",
    "mlflow_ui",
    "served",
    "browser",
    "sprint",
}
PIPELINE_FIXTURES |= {"project", "pristine"}  # test_pretrain's and test_bad_input's project copies run stages


# `make test` runs two workers (pytest-xdist, --dist loadgroup). A session fixture is built once per worker, so the
# tests of one that costs minutes share a worker: it is built once, as in a run on one worker. xdist 3.8 groups by
# a "@<group>" suffix of the test's id, which it sets through an attribute pytest 9 no longer reads (Node._nodeid;
# pytest 9 keeps Node._id), so the suffix is set here, as xdist would.
SHARED_ON_ONE_WORKER = ("ablation", "sprint")


def pytest_collection_modifyitems(config, items) -> None:
    grouping = getattr(config.option, "loadgroup", False)  # an xdist worker of `--dist loadgroup`
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if PIPELINE_FIXTURES & fixtures:
            item.add_marker(pytest.mark.pipeline)
        group = next((f for f in SHARED_ON_ONE_WORKER if f in fixtures), None)
        if group and grouping:
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread for a module of tiny-model tests: threads only add overhead on such tensors,
    and on a busy 2-core machine two spinning threads make each step 10-100x slower. Use with
    `pytestmark = pytest.mark.usefixtures("single_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def assert_no_output(path: Path) -> None:
    """Nothing at `path` and no temporary beside it: a failed stage left nothing that looks complete."""
    assert not path.exists(), f"{path} exists after a failure"
    leftovers = list(path.parent.glob(f".tmp-{path.name}-*")) if path.parent.exists() else []
    assert not leftovers, f"temporaries left: {leftovers}"


# The report tests' populated MLflow store (imported last: report_helpers uses the fixtures above).
# The operations tests' Prefect server and finished ablation (test_flows.py, test_ui.py).
from ops_helpers import ablation, prefect_api, prefect_server  # noqa: E402,F401
from report_helpers import store  # noqa: E402,F401
