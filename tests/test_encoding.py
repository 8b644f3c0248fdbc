"""Encoding policy: EOS validation, BOS kept, literal special-token text, loss masks, uint32 vocabularies."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from tokenizers.processors import TemplateProcessing

from tests.conftest import EOS, shared_path
from tokenization.encoding import Encoder, TokenizerError


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


def big_vocab_tokenizer(path) -> str:
    """A word-level tokenizer of 70,000 ids: past uint16, so its files must be uint32."""
    vocab = {EOS: 0, "[UNK]": 1} | {f"w{i}": i + 2 for i in range(69_998)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([EOS])
    tokenizer.save(str(path))
    return str(path)


def test_unknown_eos_is_a_clear_error(sample_tokenizer) -> None:
    with pytest.raises(TokenizerError, match=r"EOS token '</s>' is not in the vocabulary of .*tokenizer.json"):
        Encoder(str(sample_tokenizer), "</s>")


def test_unloadable_tokenizer_names_the_path(tmp_path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(TokenizerError, match=f"{bad}: not a tokenizers JSON file"):
        Encoder(str(bad))


def test_a_missing_tokenizer_file_is_not_looked_up_on_the_hub(tmp_path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizr\.json: no such tokenizer file"):
        Encoder(str(tmp_path / "tokenizr.json"))


def test_eos_is_appended_and_folder_paths_load(sample_tokenizer) -> None:
    encoder = Encoder(str(sample_tokenizer.parent), EOS)
    plain = Tokenizer.from_file(str(sample_tokenizer)).encode("hello world").ids
    encoded = encoder.encode(["hello world", "x"])
    assert encoded.tokens[: len(plain) + 1].tolist() == [*plain, encoder.eos_id]
    assert encoded.lengths.tolist() == [len(plain) + 1, 2]
    assert encoder.bos_ids == [] and encoder.token_size == 2


def test_bos_from_the_tokenizer_is_kept_with_eos(bos_tokenizer) -> None:
    encoder = Encoder(bos_tokenizer, EOS)
    ids = encoder.encode(["hello"]).tokens.tolist()
    assert encoder.bos_ids == [encoder.tokenizer.token_to_id("<s>")]
    assert ids[0] == encoder.bos_ids[0] and ids[-1] == encoder.eos_id


def test_mistral_keeps_bos_and_appends_eos() -> None:
    encoder = Encoder(str(shared_path("tokenizers", "mistral-7b", "tokenizer.json")), "</s>")
    assert encoder.encode(["Hello world"]).tokens.tolist() == [1, 22557, 1526, 2]


def test_literal_special_token_text_policies(sample_tokenizer) -> None:
    text = f"quote {EOS} twice {EOS}"
    as_text = Encoder(str(sample_tokenizer), EOS, "text").encode([text])
    as_special = Encoder(str(sample_tokenizer), EOS, "special").encode([text])
    eos = Encoder(str(sample_tokenizer), EOS).eos_id
    assert as_text.tokens.tolist().count(eos) == 1  # only the appended EOS
    assert as_special.tokens.tolist().count(eos) == 3  # datatrove's behaviour
    assert as_text.special_literals == as_special.special_literals == {EOS: 2}
    decoded = Tokenizer.from_file(str(sample_tokenizer)).decode(as_text.tokens.tolist()[:-1])
    assert decoded == text


def test_loss_mask_zeroes_overlapping_tokens_keeps_eos_and_never_crops(sample_tokenizer) -> None:
    encoder = Encoder(str(sample_tokenizer), EOS)
    head, answer = "### Instruction:\nName a module.\n### Response:\n", "The argparse module."
    text = head + answer
    encoded = encoder.encode([text, text, text], [[(0, len(head))], [(len(head), len(text))], None])
    n = encoded.lengths[0]
    loss = encoded.loss.reshape(3, n)
    plain = encoder.tokenizer.encode(text)
    overlaps_head = np.array([s < len(head) and e > s for s, e in plain.offsets[:-1]] + [False])
    assert loss[0].tolist() == (~overlaps_head).astype(int).tolist()
    assert loss[0, -1] == 1 and loss[1, -1] == 1  # the EOS always keeps its loss
    assert loss[1, :-1].tolist() == overlaps_head[:-1].astype(int).tolist()  # masked to the end, not cropped
    assert loss[2].tolist() == [1] * n
    assert encoded.tokens.size == 3 * n


def test_vocabulary_past_uint16_uses_four_bytes(tmp_path) -> None:
    encoder = Encoder(big_vocab_tokenizer(tmp_path / "tokenizer.json"), EOS)
    assert encoder.vocab_size == 70_000 and encoder.token_size == 4
    assert encoder.encode(["w69997 w3"]).tokens.tolist() == [69_999, 5, 0]
