"""Encoding policy: the EOS (given, the tokenizer's own, or none), BOS kept, literal special-token text, loss
masks, uint32 vocabularies."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import fsspec
import gigatoken
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from tokenizers.processors import TemplateProcessing

from tests.support.paths import shared_path
from tests.support.tokenizers import EOS, big_vocab_tokenizer
from tokenization.tokenizer import cutting
from tokenization.tokenizer.cutting import Piece
from tokenization.tokenizer.encoding import Encoder
from tokenization.tokenizer.engines import HF_GROUP_CHARS, CheckedEngine
from tokenization.tokenizer.framing import framed
from tokenization.tokenizer.loading import EOS_CANDIDATES, TokenizerError
from tokenization.tokenizer.loss_masks import no_loss_mask

# Each shared tokenizer's own end-of-text token and id, found with no EOS given.
OWN_EOS = {
    "gpt2": ("<|endoftext|>", 50256),
    "llama3": ("<|end_of_text|>", 128001),
    "mistral-7b": ("</s>", 2),
    "falcon-7b": ("<|endoftext|>", 11),
    "deepseek-v4": ("<｜end▁of▁sentence｜>", 1),
}


@pytest.fixture(scope="module")
def bos_tokenizer(tmp_path_factory, sample_tokenizer) -> str:
    """The sample tokenizer with a post-processor that adds a BOS, as Mistral's and Llama-2's do."""
    tokenizer = Tokenizer.from_file(str(sample_tokenizer))
    tokenizer.add_special_tokens(["<s>"])
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    path = tmp_path_factory.mktemp("bos") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def sample_with(folder: Path, sample_tokenizer: Path, specials: list[str], appended: str | None = None) -> Path:
    """The sample tokenizer with more special tokens and, with ``appended``, a post-processor ``$A appended``."""
    tokenizer = Tokenizer.from_file(str(sample_tokenizer))
    tokenizer.add_special_tokens(specials)
    if appended is not None:
        tokenizer.post_processor = TemplateProcessing(
            single=f"$A {appended}", special_tokens=[(appended, tokenizer.token_to_id(appended))]
        )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def word_tokenizer(path: Path, specials: list[str]) -> Path:
    """A word-level tokenizer with these special tokens and none of the well-known end-of-text tokens."""
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(path))
    return path


def test_unknown_eos_suggests_the_tokenizers_own(sample_tokenizer) -> None:
    with pytest.raises(TokenizerError) as raised:
        Encoder(str(sample_tokenizer), eos_token="</s>")
    assert str(raised.value) == (
        f"EOS token '</s>' is not in the vocabulary of {sample_tokenizer}; its own end-of-text token is "
        f"'{EOS}' (from its vocabulary): leave the EOS unset to use it"
    )


def test_unknown_eos_suggests_llama3s_own_not_reserved_tokens() -> None:
    path = shared_path("tokenizers", "llama3", "tokenizer.json")
    with pytest.raises(TokenizerError) as raised:
        Encoder(str(path), eos_token=EOS)
    assert str(raised.value) == (
        f"EOS token '<|endoftext|>' is not in the vocabulary of {path}; its own end-of-text token is "
        "'<|end_of_text|>' (from its vocabulary): leave the EOS unset to use it"
    )


def test_unknown_eos_lists_special_tokens_when_the_tokenizer_has_no_own(tmp_path) -> None:
    path = word_tokenizer(tmp_path / "tokenizer.json", ["<pad>", "<sep>"])
    with pytest.raises(TokenizerError) as raised:
        Encoder(str(path), eos_token="</s>")
    assert str(raised.value) == f"EOS token '</s>' is not in the vocabulary of {path} (special tokens: <pad>, <sep>)"


@pytest.mark.parametrize("name", sorted(OWN_EOS))
def test_the_eos_of_each_shared_tokenizer_is_its_own(name: str) -> None:
    path = str(shared_path("tokenizers", name, "tokenizer.json"))
    token, token_id = OWN_EOS[name]
    encoder = Encoder(path)
    described = encoder.describe()
    assert (described.eos_token, described.eos_id, described.eos_source) == (token, token_id, "vocabulary")
    plain = Tokenizer.from_file(path).encode("Hello world").ids  # mistral's BOS included
    assert encoder.encode(["Hello world"]).tokens.tolist() == [*plain, token_id]


def test_the_sample_tokenizers_own_eos(sample_tokenizer) -> None:
    encoder = Encoder(str(sample_tokenizer))
    assert (encoder.eos_token, encoder.eos_id, encoder.policy.eos_source) == (EOS, 0, "vocabulary")
    assert encoder.encode(["hello"]).tokens.tolist()[-1] == 0


@pytest.mark.parametrize("named", ["<|im_end|>", {"content": "<|im_end|>", "special": True}])
def test_tokenizer_config_json_beside_it_names_the_eos(tmp_path, sample_tokenizer, named) -> None:
    path = sample_with(tmp_path, sample_tokenizer, ["<|im_end|>"])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": named, "bos_token": None}))
    encoder = Encoder(str(path))
    im_end = encoder.tokenizer.token_to_id("<|im_end|>")
    assert (encoder.eos_token, encoder.eos_id, encoder.policy.eos_source) == (
        "<|im_end|>",
        im_end,
        "tokenizer_config.json",
    )
    assert encoder.encode(["hello"]).tokens.tolist()[-1] == im_end
    assert Encoder(str(path), eos_token=EOS).policy.eos_source == "param"  # a given EOS still wins


def test_tokenizer_config_json_is_read_beside_an_fsspec_url(sample_tokenizer) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/own-eos/tokenizer.json", sample_tokenizer.read_bytes())
    fs.pipe("/own-eos/tokenizer_config.json", json.dumps({"eos_token": EOS}).encode())
    try:
        encoder = Encoder("memory://own-eos/tokenizer.json")
        assert (encoder.eos_token, encoder.policy.eos_source) == (EOS, "tokenizer_config.json")
    finally:
        fs.rm("/own-eos", recursive=True)


def test_the_eos_the_post_processor_appends_is_used_once(tmp_path, sample_tokenizer) -> None:
    path = sample_with(tmp_path, sample_tokenizer, ["</s>"], appended="</s>")
    encoder = Encoder(str(path))
    end = encoder.tokenizer.token_to_id("</s>")
    assert (encoder.eos_token, encoder.eos_id, encoder.policy.eos_source) == ("</s>", end, "post-processor")
    plain = Tokenizer.from_file(str(sample_tokenizer)).encode("hello world").ids
    assert encoder.encode(["hello world"]).tokens.tolist() == [*plain, end]


def test_well_known_eos_tokens_in_order(tmp_path, sample_tokenizer) -> None:
    """The sample holds <|endoftext|>; adding </s> and <eos> does not change its EOS, which comes first."""
    encoder = Encoder(str(sample_with(tmp_path, sample_tokenizer, ["<eos>", "</s>"])))
    assert (encoder.eos_token, encoder.policy.eos_source) == (EOS, "vocabulary")


def test_no_eos_found_is_a_clear_error(tmp_path) -> None:
    path = word_tokenizer(tmp_path / "tokenizer.json", ["<pad>"])
    with pytest.raises(TokenizerError) as raised:
        Encoder(str(path))
    assert str(raised.value) == (
        f"{path}: no end-of-text token found (no tokenizer_config.json beside it names one, its post-processor "
        f"appends none, and its vocabulary holds none of {', '.join(EOS_CANDIDATES)}): pass --eos-token TOKEN, "
        "or --no-eos to write documents without a separator"
    )


def test_no_eos_writes_documents_without_a_separator(sample_tokenizer) -> None:
    encoder = Encoder(str(sample_tokenizer), no_eos=True)
    plain = Tokenizer.from_file(str(sample_tokenizer)).encode("hello world").ids
    assert encoder.encode(["hello world"]).tokens.tolist() == plain
    described = encoder.describe()
    assert (described.eos_token, described.eos_id, described.eos_source) == (None, None, None)
    with pytest.raises(TokenizerError, match=r"an EOS token \('<\|endoftext\|>'\) and no EOS were both asked for"):
        Encoder(str(sample_tokenizer), eos_token=EOS, no_eos=True)


def test_no_eos_keeps_the_tokenizers_post_processor(bos_tokenizer) -> None:
    encoder = Encoder(bos_tokenizer, no_eos=True)
    bos = encoder.tokenizer.token_to_id("<s>")
    plain = Tokenizer.from_file(bos_tokenizer).encode("hello", add_special_tokens=False).ids
    assert encoder.encode(["hello", "hello"]).tokens.tolist() == [bos, *plain, bos, *plain]


def test_unloadable_tokenizer_names_the_path(tmp_path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(TokenizerError, match=f"{bad}: not a tokenizers JSON file"):
        Encoder(str(bad))


@pytest.mark.parametrize("place", ["added_tokens", "vocab"])
def test_an_absurd_token_id_is_refused_at_load(tmp_path, sample_tokenizer, place: str) -> None:
    """Issue 37, finding 6: an added token at id 4,294,967,295 made the fast engine ask for 64 GiB, which aborted
    the process (exit 134); so did the same id in the model's vocabulary."""
    tokenizer = json.loads(sample_tokenizer.read_bytes())
    if place == "vocab":
        tokenizer["model"]["vocab"]["<|far|>"] = 2**32 - 1
    else:
        tokenizer["added_tokens"].append({**tokenizer["added_tokens"][0], "id": 2**32 - 1, "content": "<|far|>"})
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(tokenizer))
    with pytest.raises(TokenizerError) as raised:
        Encoder(str(path), eos_token=EOS).encode(["hello <|far|>"])
    assert str(raised.value) == (
        f"{path}: token '<|far|>' has id 4,294,967,295; token ids must be below 16,777,216 (the largest "
        "vocabularies hold about a million tokens): give the tokenizer ids that follow its vocabulary"
    )


def test_an_id_past_a_gap_in_the_vocabulary_counts_in_its_size(tmp_path, sample_tokenizer) -> None:
    """Ids may leave gaps (cl100k's do): the vocabulary's size, and so the token width, is past its highest id."""
    tokenizer = json.loads(sample_tokenizer.read_bytes())
    tokenizer["model"]["vocab"]["<|far|>"] = 70_000
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(tokenizer))
    encoder = Encoder(str(path), eos_token=EOS)
    assert (encoder.vocab_size, encoder.token_size) == (70_001, 4)
    assert encoder.encode(["hello"]).tokens.tolist() == Encoder(str(sample_tokenizer)).encode(["hello"]).tokens.tolist()


@pytest.fixture
def panicking_tokenizer(tmp_path, sample_tokenizer) -> Path:
    """The sample tokenizer, split first by a regex that backtracks without end on a run of "a" with no "b": HF's
    regex engine panics (the fast engine declines such a pattern)."""
    tokenizer = json.loads(sample_tokenizer.read_bytes())
    split = {"type": "Split", "pattern": {"Regex": "(a+)+b"}, "behavior": "Isolated", "invert": False}
    byte_level = tokenizer["pre_tokenizer"] | {"use_regex": False}
    tokenizer["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, byte_level]}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(tokenizer))
    return path


def hf_panic(panicking_tokenizer: Path) -> BaseException:
    """The panic HF's engine raises, pyo3's ``PanicException`` (a BaseException)."""
    try:
        Tokenizer.from_file(str(panicking_tokenizer)).encode("a" * 100)
    except BaseException as exc:
        return exc
    pytest.fail("the catastrophic regex did not make HF's engine panic")


@pytest.mark.parametrize(
    ("texts", "doing"),
    [
        (["hello", "a" * 100], "encoding documents 0-1 of this run"),
        ([("a" * 60 + " ") * 4], "cutting document 0 of this run"),
    ],
)
def test_an_engine_panic_is_one_line_naming_the_tokenizer(
    panicking_tokenizer, monkeypatch, texts: list[str], doing: str
) -> None:
    """Issue 37, finding 6: a catastrophic ``Split`` regex ended the run with a PanicException traceback, while
    encoding or while HF confirms where a long text is cut."""
    monkeypatch.setattr(cutting, "PIECE_CHARS", 100)
    with pytest.raises(TokenizerError) as raised:
        Encoder(str(panicking_tokenizer), eos_token=EOS).encode(texts)
    assert str(raised.value) == (
        f"{panicking_tokenizer}: its engine failed {doing} (Onig: Regex search error: retry-limit-in-match over): "
        "this tokenizer cannot encode that text; fix the tokenizer, or give another"
    )


def test_a_fast_engine_panic_is_one_line_or_declines_it(panicking_tokenizer, sample_tokenizer, monkeypatch) -> None:
    """gigatoken's panics are pyo3's too: one that encodes is an error as HF's are; one that loads declines it."""
    panic = type(hf_panic(panicking_tokenizer))

    class Panicking:
        @classmethod
        def from_json(cls, data: bytes) -> Panicking:
            raise panic("table index out of bounds")

        def encode_batch(self, texts: list[str], parallel: bool):
            raise panic("table index out of bounds")

    encoder = Encoder(str(sample_tokenizer), eos_token=EOS)
    assert encoder.engine.name == "gigatoken" and isinstance(encoder.engine, CheckedEngine)
    monkeypatch.setattr(encoder.engine.fast, "_tokenizer", Panicking())
    with pytest.raises(TokenizerError) as raised:
        encoder.encode(["hello " * HF_GROUP_CHARS])  # a smaller group goes to HF alone
    assert str(raised.value) == (
        f"{sample_tokenizer}: its engine failed encoding document 0 of this run (table index out of bounds): this "
        "tokenizer cannot encode that text; fix the tokenizer, or give another"
    )
    monkeypatch.setattr(gigatoken, "Tokenizer", Panicking)  # the fast engine imports it as it loads
    declined = Encoder(str(sample_tokenizer), eos_token=EOS)
    assert declined.encode(["hello"]).tokens.tolist() == encoder.tokenizer.encode("hello").ids
    assert declined.engine_note == "fast engine declined: gigatoken cannot load it (table index out of bounds)"


def test_a_missing_tokenizer_file_is_not_looked_up_on_the_hub(tmp_path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizr\.json: no such tokenizer file"):
        Encoder(str(tmp_path / "tokenizr.json"))


def test_eos_is_appended_and_folder_paths_load(sample_tokenizer) -> None:
    encoder = Encoder(str(sample_tokenizer.parent), eos_token=EOS)
    plain = Tokenizer.from_file(str(sample_tokenizer)).encode("hello world").ids
    encoded = encoder.encode(["hello world", "x"])
    assert encoded.tokens[: len(plain) + 1].tolist() == [*plain, encoder.eos_id]
    assert encoded.lengths.tolist() == [len(plain) + 1, 2]
    assert encoder.bos_ids == [] and encoder.token_size == 2


def test_bos_from_the_tokenizer_is_kept_with_eos(bos_tokenizer) -> None:
    encoder = Encoder(bos_tokenizer, eos_token=EOS)
    ids = encoder.encode(["hello"]).tokens.tolist()
    assert encoder.bos_ids == [encoder.tokenizer.token_to_id("<s>")]
    assert ids[0] == encoder.bos_ids[0] and ids[-1] == encoder.eos_id


def test_mistral_keeps_bos_and_appends_eos() -> None:
    encoder = Encoder(str(shared_path("tokenizers", "mistral-7b", "tokenizer.json")), eos_token="</s>")
    assert encoder.encode(["Hello world"]).tokens.tolist() == [1, 22557, 1526, 2]


@pytest.mark.parametrize("special_text", ["text", "special"])
def test_an_encoder_told_what_the_plan_loaded_encodes_the_same_ids(bos_tokenizer, special_text) -> None:
    """A build's ranks take what loading the tokenizer told the plan (``Encoder.facts``) and load HF's tokenizer
    only to encode; told about other bytes, an encoder loads its own."""
    texts = [f"hello {EOS} world", "a second document"]
    loaded = Encoder(bos_tokenizer, eos_token=EOS, special_text=special_text)
    told = Encoder(bos_tokenizer, eos_token=EOS, special_text=special_text, known=loaded.facts())
    assert "tokenizer" not in told.__dict__ and told.describe().engine == "none"  # nothing loaded yet
    how = ("engine", "engine_note", "load_seconds", "self_checked_docs")  # how it ran, not what it is

    def described(encoder: Encoder) -> dict:
        return {k: v for k, v in encoder.describe().to_json().items() if k not in how}

    assert told.facts() == loaded.facts() and described(told) == described(loaded)
    assert told.encode(texts).tokens.tolist() == loaded.encode(texts).tokens.tolist()
    stranger = replace(loaded.facts(), sha256="0" * 64, eos_id=-1)
    assert Encoder(bos_tokenizer, eos_token=EOS, known=stranger).eos_id == loaded.eos_id


def test_literal_special_token_text_policies(sample_tokenizer) -> None:
    text = f"quote {EOS} twice {EOS}"
    as_text = Encoder(str(sample_tokenizer), eos_token=EOS, special_text="text").encode([text])
    as_special = Encoder(str(sample_tokenizer), eos_token=EOS, special_text="special").encode([text])
    eos = Encoder(str(sample_tokenizer), eos_token=EOS).eos_id
    assert as_text.tokens.tolist().count(eos) == 1  # only the appended EOS
    assert as_special.tokens.tolist().count(eos) == 3  # datatrove's behaviour
    assert as_text.special_literals == as_special.special_literals == {EOS: 2}
    decoded = Tokenizer.from_file(str(sample_tokenizer)).decode(as_text.tokens.tolist()[:-1])
    assert decoded == text


def test_loss_mask_zeroes_overlapping_tokens_keeps_eos_and_never_crops(sample_tokenizer) -> None:
    encoder = Encoder(str(sample_tokenizer), eos_token=EOS)
    head, answer = "### Instruction:\nName a module.\n### Response:\n", "The argparse module."
    text = head + answer
    encoded = encoder.encode([text, text, text], [[(0, len(head))], [(len(head), len(text))], None])
    n = encoded.lengths[0]
    assert encoded.loss is not None
    loss = encoded.loss.reshape(3, n)
    plain = encoder.tokenizer.encode(text)
    overlaps_head = np.array([s < len(head) and e > s for s, e in plain.offsets[:-1]] + [False])
    assert loss[0].tolist() == (~overlaps_head).astype(int).tolist()
    assert loss[0, -1] == 1 and loss[1, -1] == 1  # the EOS always keeps its loss
    assert loss[1, :-1].tolist() == overlaps_head[:-1].astype(int).tolist()  # masked to the end, not cropped
    assert loss[2].tolist() == [1] * n
    assert encoded.tokens.size == 3 * n


def test_no_loss_mask_is_the_overlap_of_any_range(sample_tokenizer) -> None:
    """Against the definition, token by token and range by range: random, empty, nested and touching ranges."""
    text = (
        "### Instruction:\nName a module, and say why.\n### Response:\nThe argparse module <|endoftext|> parses. " * 4
    )
    encoding = Tokenizer.from_file(str(sample_tokenizer)).encode(text)
    spans = encoding.offsets
    rng = np.random.default_rng(7)
    for _ in range(300):
        starts = rng.integers(0, len(text) + 1, size=int(rng.integers(1, 6)))
        ranges = [(int(a), int(min(len(text), a + rng.choice([0, 1, 3, 40])))) for a in starts]
        expected = [any(b < r_end and e > r_start for r_start, r_end in ranges) and e > b for b, e in spans]
        assert no_loss_mask(encoding, Piece(0, 0, len(text)), ranges).tolist() == expected, ranges


def test_vocabulary_past_uint16_uses_four_bytes(tmp_path) -> None:
    encoder = Encoder(big_vocab_tokenizer(tmp_path / "tokenizer.json"), eos_token=EOS)
    assert encoder.vocab_size == 70_000 and encoder.token_size == 4
    assert encoder.encode(["w69997 w3"]).tokens.tolist() == [69_999, 5, 0]


def test_a_lone_document_is_framed_in_place_and_like_any_other() -> None:
    """A huge document is a batch of its own, and its EOS goes after its ids in place: never a second copy."""
    body = np.arange(5, dtype=np.uint16)
    out = framed(body, np.array([5]), [], [9])
    assert out.tolist() == [0, 1, 2, 3, 4, 9] and out is body  # the same array, grown
    many = framed(np.arange(5, dtype=np.uint16), np.array([2, 3]), [7], [9])
    assert many.tolist() == [7, 0, 1, 9, 7, 2, 3, 4, 9]


def test_a_record_larger_than_a_batch_is_a_batch_of_its_own() -> None:
    from tokenization.inputs.reader import Record
    from tokenization.tokenizer.counts import Counts
    from tokenization.tokenizer.documents import DocumentOptions, _record_batches

    def record(text: str) -> Record:
        return Record(text, "id", None, "f", 1)

    options = DocumentOptions(tokenizer="t", batch_bytes=10)
    texts = ["ab", "cd", "x" * 30, "ef", "y" * 12, "gh"]
    batches = list(_record_batches(iter(map(record, texts)), Counts(), options, lambda _: None))
    assert [[r.text for r in b] for b in batches] == [["ab", "cd"], ["x" * 30], ["ef"], ["y" * 12], ["gh"]]
