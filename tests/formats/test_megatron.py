"""Megatron .bin/.idx output, read back by megatron-core's own IndexedDataset.

megatron-core takes ~20 s to import, so every output of this module is read in one subprocess.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.corpus import write_jsonl
from tests.support.references import in_trainer_env
from tests.support.stages import documents, run
from tests.support.tokenizers import EOS, big_vocab_tokenizer
from tokenization.formats.megatron import MegatronFile

READ_WITH_MEGATRON = """
import json, sys, warnings
warnings.filterwarnings("ignore")
from megatron.core.datasets.indexed_dataset import IndexedDataset
out = {}
for prefix in sys.argv[1:]:
    ds = IndexedDataset(prefix)
    out[prefix] = {"docs": [ds[i].tolist() for i in range(len(ds))], "dtype": ds.index.dtype.__name__,
                   "document_indices": ds.document_indices.tolist()}
print(json.dumps(out))
"""
OPTIONS = {"seed": 5, "max_tokens_per_file": 40_000}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, sample_corpus, sample_tokenizer) -> tuple:
    """Megatron and .ds runs of the sample (document and chunk shuffles) and a uint32 vocabulary, all read back
    by megatron-core."""
    tmp = tmp_path_factory.mktemp("megatron")
    runs = {}
    for kind, chunk in (("doc", None), ("chunk", 700)):
        run([sample_corpus], tmp / kind / "ds", sample_tokenizer, shuffle_chunk_size=chunk, **OPTIONS)
        result = run(
            [sample_corpus],
            tmp / kind / "mg",
            sample_tokenizer,
            shuffle_chunk_size=chunk,
            output_format="megatron",
            **OPTIONS,
        )
        runs[kind] = [tmp / kind / "mg" / o["name"].removesuffix(".bin") for o in result["outputs"]]
    tokenizer = big_vocab_tokenizer(tmp / "tokenizer.json")
    inputs = write_jsonl(tmp / "in.jsonl", [{"text": "w69997 w1"}, {"text": "w65536"}])
    run([inputs], tmp / "wide", tokenizer, shuffle_documents=False, output_format="megatron", eos_token=EOS)
    runs["wide"] = [tmp / "wide" / "00000_00000_unshuffled"]
    prefixes = [str(p) for paths in runs.values() for p in paths]
    return tmp, runs, json.loads(in_trainer_env(READ_WITH_MEGATRON, *prefixes))


@pytest.mark.parametrize("kind", ["doc", "chunk"])
def test_megatron_core_reads_the_documents_of_the_ds_run(outputs, kind) -> None:
    tmp, runs, read = outputs
    assert [p.name for p in runs[kind]] == [f"00000_0000{i}_{kind}_shuffled" for i in range(2)]
    docs = []
    for prefix in runs[kind]:
        got = read[str(prefix)]
        assert got["dtype"] == "uint16" and got["document_indices"] == list(range(len(got["docs"]) + 1))
        docs.extend(got["docs"])
        ours = MegatronFile(str(prefix))
        assert int(ours.lengths.sum()) == ours.num_tokens
        assert ours.pointers[-1] == 2 * (ours.num_tokens - int(ours.lengths[-1]))
    assert docs == documents(tmp / kind / "ds")


def test_megatron_int32_for_large_vocabularies(outputs) -> None:
    _, runs, read = outputs
    got = read[str(runs["wide"][0])]
    assert got["dtype"] == "int32" and got["docs"] == [[69_999, 3, 0], [65_538, 0]]
    assert np.array_equal(MegatronFile(str(runs["wide"][0])).tokens, [69_999, 3, 0, 65_538, 0])


def test_loss_needs_the_ds_format(tmp_path, sample_corpus, sample_tokenizer) -> None:
    with pytest.raises(ValueError, match="Megatron's indexed dataset has no loss mask"):
        run([sample_corpus], tmp_path, sample_tokenizer, output_format="megatron", save_loss=True)
