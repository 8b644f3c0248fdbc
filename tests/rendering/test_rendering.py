"""Instruction and chat data: records rendered through a field template or a Jinja2 chat template into one
document, with loss only on the answer (a token carries loss when all its characters are in it), the EOS with
loss, and records that cannot be rendered quarantined with their reason."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.support.corpus import write_jsonl
from tests.support.paths import shared_path
from tests.support.stages import run
from tests.support.tokenizers import EOS
from tokenization.errors import UsageError
from tokenization.formats.ds import TokenFile
from tokenization.rendering.renderer import Rendered, chat_template, field_template, no_loss_ranges
from tokenization.stages.count import CountConfig, count_tokens
from tokenization.stages.tokenize import TokenizeConfig
from tokenization.storage.folder import Folder
from tokenization.tokenizer.counts import TooManyRejects

GPT2_EOS = "<|endoftext|>"
INSTRUCTION = "{prompt}\n\n{response}"
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
)
# Llama 3's template trims every content: the spans must follow the trimmed text.
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
)


@pytest.fixture(scope="module")
def gpt2() -> Path:
    return shared_path("tokenizers", "gpt2", "tokenizer.json")


@pytest.fixture(scope="module")
def instruct() -> list[dict]:
    """The shared instruct corpus: 1,000 records of ``prompt`` and ``response``."""
    with gzip.open(shared_path("corpora", "instruct_dolly_hhrlhf.jsonl.gz"), "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def as_chat(record: dict) -> dict:
    """A prompt/response record as three messages: the prompt's preamble as system, its instruction as user."""
    system, _, instruction = record["prompt"].partition("\n\n### Instruction:\n")
    user = instruction.removesuffix("\n\n### Response:\n") or record["prompt"]
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
        {"role": "assistant", "content": record["response"]},
    ]
    return {"id": record["id"], "messages": messages}


def documents_with_loss(output: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each document's tokens and loss bytes, in file order."""
    (path,) = sorted(output.glob("*.ds"))
    f = TokenFile(str(path))
    ends = np.asarray(f.ends, dtype=np.int64)[:-1]
    return list(zip(np.split(np.asarray(f.tokens), ends), np.split(np.asarray(f.loss), ends), strict=True))


def assert_loss_only_on_answers(output: Path, tokenizer: Path, parts: list[tuple[str, str, str]]) -> None:
    """What the issue checks, document by document, for documents rendered as ``before + answer + after``: the
    loss tokens (EOS aside) decode to the answer, at most a few characters short at its ends, in one run; the
    loss-0 tokens decode to the rest of the document and those few characters, so the answer is not among them
    (it may occur in the prompt: extractive questions quote it); the EOS carries loss."""
    tok = Tokenizer.from_file(str(tokenizer))
    docs = documents_with_loss(output)
    assert len(docs) == len(parts)
    short = []
    for (tokens, loss), (before, answer, after) in zip(docs, parts, strict=True):
        assert tokens[-1] == tok.token_to_id(GPT2_EOS) and loss[-1] == 1
        body, mask = tokens[:-1], loss[:-1].astype(bool)
        inside = tok.decode(body[mask].tolist(), skip_special_tokens=False)
        outside = tok.decode(body[~mask].tolist(), skip_special_tokens=False)
        assert np.count_nonzero(np.diff(mask.astype(np.int8)) == 1) + mask[0] == bool(inside)  # one run of loss
        at = answer.find(inside)
        assert at >= 0, (inside, answer)
        assert outside == before + answer[:at] + answer[at + len(inside) :] + after
        short.append(len(answer) - len(inside))
    assert max(short) <= 3 and np.mean(short) < 1, max(short)


def test_a_field_template_puts_loss_on_the_answer_of_the_shared_instruct_corpus(tmp_path, gpt2, instruct) -> None:
    corpus = write_jsonl(tmp_path / "instruct.jsonl", instruct)
    result = run(
        [corpus],
        tmp_path / "out",
        gpt2,
        eos_token=GPT2_EOS,
        template=INSTRUCTION,
        loss_fields="response",
        save_loss=True,
        shuffle_documents=False,
    )
    counts = result["counts"]
    assert counts["docs_written"] == 1000 and counts["rejected_total"] == 0  # without a template: all rejected
    parts = [(r["prompt"] + "\n\n", r["response"], "") for r in instruct]
    assert_loss_only_on_answers(tmp_path / "out", gpt2, parts)
    loss = sum(int(loss.sum()) for _, loss in documents_with_loss(tmp_path / "out"))
    assert counts["loss_tokens"] == loss and 0.2 < loss / counts["tokens"] < 0.8
    sha = hashlib.sha256(INSTRUCTION.encode()).hexdigest()
    assert result["rendering"] == {"kind": "template", "text": INSTRUCTION, "sha256": sha, "loss": ["response"]}


def test_a_chat_template_puts_loss_on_the_assistant(tmp_path, gpt2, instruct) -> None:
    chats = [as_chat(r) for r in instruct]
    corpus = write_jsonl(tmp_path / "chat.jsonl", chats)
    (tmp_path / "chat.jinja").write_text(CHATML)
    result = run(
        [corpus],
        tmp_path / "out",
        gpt2,
        eos_token=GPT2_EOS,
        messages_key="messages",
        chat_template=str(tmp_path / "chat.jinja"),
        save_loss=True,
        shuffle_documents=False,
    )
    assert result["counts"]["docs_written"] == 1000
    turn = "<|im_start|>{}\n{}<|im_end|>\n".format
    parts = [
        (turn(*m[0].values()) + turn(*m[1].values()) + "<|im_start|>assistant\n", m[2]["content"], "<|im_end|>\n")
        for m in (c["messages"] for c in chats)
    ]
    assert_loss_only_on_answers(tmp_path / "out", gpt2, parts)
    assert result["rendering"]["kind"] == "chat" and result["rendering"]["loss"] == ["assistant"]
    tok = Tokenizer.from_file(str(gpt2))
    tokens, _ = documents_with_loss(tmp_path / "out")[0]
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chats[0]["messages"])
    assert tok.decode(tokens[:-1].tolist()) == expected  # one document, rendered as the template says


def test_loss_roles_and_a_tokenizer_config_template(tmp_path, sample_tokenizer) -> None:
    """A tokenizer_config.json's template with its bos_token; two roles with loss; contents the template trims."""
    config = {"chat_template": [{"name": "default", "template": LLAMA3}], "bos_token": {"content": "<s>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Name a module.  "},
        {"role": "assistant", "content": "argparse\n"},
    ]
    renderer = chat_template(
        (tmp_path / "tokenizer_config.json").read_text(),
        "tokenizer_config.json",
        "messages",
        ["user", "assistant"],
        special_tokens=["<s>"],
    )
    rendered = renderer.render({"messages": messages})
    assert isinstance(rendered, Rendered), rendered
    assert rendered.text.startswith("<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
    assert rendered.loss_spans is not None
    assert [rendered.text[a:b] for a, b in rendered.loss_spans] == ["Name a module.", "argparse"]
    assert renderer.describe()["text"] == LLAMA3


@pytest.mark.parametrize(
    ("template", "record", "text", "loss"),
    [
        (INSTRUCTION, {"prompt": "Q?", "response": "A."}, "Q?\n\nA.", ["A."]),
        ("{meta.title}: {{literal}} {body}", {"meta": {"title": "T"}, "body": "B"}, "T: {literal} B", ["B"]),
        ("{ q } then {a}{a}", {"q": "é", "a": "x"}, "é then xx", ["x", "x"]),
    ],
)
def test_field_templates_render_fields_and_their_loss_spans(template, record, text, loss) -> None:
    renderer = field_template(template, [template.rsplit("{", 1)[1].rstrip("}").strip()])
    rendered = renderer.render(record)
    assert isinstance(rendered, Rendered), rendered
    assert rendered.text == text
    assert rendered.loss_spans is not None
    assert [rendered.text[a:b] for a, b in rendered.loss_spans] == loss


def test_without_loss_fields_every_token_carries_loss_and_no_loss_ranges_still_apply() -> None:
    rendered = field_template(INSTRUCTION).render({"prompt": "Q?", "response": "A."})
    assert isinstance(rendered, Rendered) and rendered.loss_spans is None
    assert no_loss_ranges(None, 6, None) is None and no_loss_ranges(None, 6, [(0, 2)]) == [(0, 2)]
    assert no_loss_ranges([(4, 6)], 6, None) == [(0, 4)]
    assert no_loss_ranges([(1, 2), (4, 5)], 6, [(0, 1)]) == [(0, 1), (0, 1), (2, 4), (5, 6)]
    assert no_loss_ranges([], 3, None) == [(0, 3)]  # an empty answer: nothing carries loss but the EOS


@pytest.mark.parametrize(
    ("template", "loss_fields", "message"),
    [
        ("no fields", [], "names no {field}"),
        ("{prompt} {response", [], "is not a {field}"),
        ("{prompt} {}", [], "is not a {field}"),
        ("{prompt}", ["response"], "loss field 'response' is not in the template; its fields are prompt"),
    ],
)
def test_a_bad_template_is_a_usage_error(template, loss_fields, message) -> None:
    with pytest.raises(UsageError, match=message.replace("{", r"\{").replace("}", r"\}")):
        field_template(template, loss_fields)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"template": "{a}", "messages_key": "m", "chat_template": "c.jinja"}, "template or messages_key"),
        ({"loss_fields": "a", "save_loss": True}, "loss_fields needs a template"),
        ({"messages_key": "m"}, "messages_key and chat_template go together"),
        ({"template": "{a}", "loss_fields": "a"}, "loss_fields needs save_loss"),
    ],
)
def test_conflicting_options_fail_before_any_data(options, message, sample_tokenizer) -> None:
    with pytest.raises(UsageError, match=message):
        TokenizeConfig(inputs=["x"], output="y", tokenizer=str(sample_tokenizer), **options)


def test_records_that_cannot_be_rendered_are_quarantined_with_their_reason(tmp_path, sample_tokenizer) -> None:
    good = [{"id": str(i), "prompt": f"Question {i}?", "response": f"Answer {i}."} for i in range(400)]
    bad: list[dict[str, Any]] = [
        {"id": "a", "prompt": "Q?"},
        {"id": "b", "prompt": "Q?", "response": 7},
        {"id": "c", "response": None},
    ]
    corpus = write_jsonl(tmp_path / "in.jsonl", good + bad)
    result = run(
        [corpus], tmp_path / "out", sample_tokenizer, template=INSTRUCTION, loss_fields="response", save_loss=True
    )
    expected = {"missing_response": 1, "response_not_string": 1, "missing_prompt": 1}
    assert result["counts"]["rejected"] == expected
    quarantined = [json.loads(line) for line in (tmp_path / "out" / "_quarantine").glob("*").__next__().open()]
    assert sorted((json.loads(q["raw"])["id"], q["reason"]) for q in quarantined) == [
        ("a", "missing_response"),
        ("b", "response_not_string"),
        ("c", "missing_prompt"),
    ]


def test_messages_without_role_or_content_and_template_errors_are_quarantined(tmp_path) -> None:
    renderer = chat_template(
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('needs a system message') }}{% endif %}" + CHATML,
        "chat.jinja",
        "messages",
        ["assistant"],
    )
    system = {"role": "system", "content": "S"}
    assert renderer.render({"messages": [system, {"role": "user"}]}) == "message_without_content"
    assert renderer.render({"messages": [system, {"content": "x"}]}) == "message_without_role"
    assert renderer.render({"messages": [system, {"role": "user", "content": ["parts"]}]}) == "message_without_content"
    assert renderer.render({"messages": "hi"}) == "messages_not_a_list_of_messages"
    assert renderer.render({}) == "missing_messages"
    assert renderer.render({"messages": [{"role": "user", "content": "x"}]}) == (
        "chat_template_error: needs a system message"
    )


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__.__mro__[1].__subclasses__() }}",  # the classic escape from a template
        "{% include '/etc/passwd' %}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    ],
)
def test_a_chat_template_is_sandboxed(template) -> None:
    rendered = chat_template(template, "evil.jinja", "messages", ["assistant"]).render(
        {"messages": [{"role": "user", "content": "x"}]}
    )
    assert isinstance(rendered, str) and rendered.startswith("chat_template_error")


def test_a_template_that_changes_the_content_is_refused() -> None:
    renderer = chat_template(
        "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}", "t", "messages", ["assistant"]
    )
    assert renderer.render({"messages": [{"role": "assistant", "content": "x"}]}) == "chat_template_changes_content"


def test_a_template_naming_a_field_no_record_has_fails_the_rank_naming_it(tmp_path, sample_tokenizer) -> None:
    corpus = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "prompt": "Q", "response": "A"} for i in range(5)])
    with pytest.raises(TooManyRejects, match=r"missing_answer 5.*its records have the fields id, prompt, response"):
        run([corpus], tmp_path / "out", sample_tokenizer, template="{prompt}{answer}")


def test_special_token_text_in_the_template_carries_no_loss(tmp_path, sample_tokenizer) -> None:
    """Under the "special" policy a template's special-token text becomes the special token: outside the answer,
    it carries no loss like the rest of the template."""
    corpus = write_jsonl(tmp_path / "in.jsonl", [{"id": "0", "prompt": "Name a module", "response": "argparse"}])
    template = "{prompt}" + EOS + "{response}"
    run(
        [corpus],
        tmp_path / "out",
        sample_tokenizer,
        template=template,
        loss_fields="response",
        save_loss=True,
        special_text="special",
    )
    ((tokens, loss),) = documents_with_loss(tmp_path / "out")
    eos = Tokenizer.from_file(str(sample_tokenizer)).token_to_id(EOS)
    (inside,) = np.flatnonzero(tokens[:-1] == eos)
    assert loss[inside] == 0 and loss[-1] == 1 and loss[inside + 1 : -1].all()


def test_count_renders_the_same_documents_and_counts_their_loss(tmp_path, sample_tokenizer) -> None:
    records = [{"id": str(i), "prompt": f"Question {i}?", "response": f"Answer number {i}."} for i in range(50)]
    corpus = write_jsonl(tmp_path / "in.jsonl", records)
    options: dict[str, Any] = {"template": INSTRUCTION, "loss_fields": "response"}
    counted = count_tokens(CountConfig(inputs=[str(corpus)], tokenizer=str(sample_tokenizer), eos_token=EOS, **options))
    tokenized = run([corpus], tmp_path / "out", sample_tokenizer, save_loss=True, **options)
    assert counted.counts.tokens == tokenized["counts"]["tokens"]
    assert counted.counts.loss_tokens == tokenized["counts"]["loss_tokens"] > 0
    assert counted.record.rendering is not None and counted.record.rendering["text"] == INSTRUCTION


def test_a_build_carries_the_mask_through_its_shuffles_and_reports_the_share_with_loss(
    tmp_path, sample_tokenizer
) -> None:
    """Rendered in the ranks, the mask moves with its tokens through the merge and the context windows; the
    report gives the share of tokens with loss, rank by rank and in all."""
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.report import render_html, report_data
    from tokenization.builds.run import Build

    records = [
        {
            "id": str(i),
            "prompt": f"Question {i}: name module {i % 7}?",
            "response": f"Module {i} is argparse. " * (i % 5 + 1),
        }
        for i in range(300)
    ]
    for part in range(2):
        write_jsonl(tmp_path / "in" / f"sft-{part}.jsonl", records[part::2])
    config = BuildConfig(
        input=str(tmp_path / "in"),
        output=str(tmp_path / "out"),
        tokenizer=str(sample_tokenizer),
        eos_token=EOS,
        template=INSTRUCTION,
        loss_fields="response",
        save_loss=True,
        seed=3,
        num_ranks=2,
        context_window=257,
        keep_intermediate=True,  # the merged files are read below
    )
    published = Build.start(config, "sft").run(parallel=2)
    run_dir = tmp_path / "out" / "sft"
    tok = Tokenizer.from_file(str(sample_tokenizer))
    answers = {r["response"] for r in records}
    merged = [TokenFile(str(p)) for p in sorted((run_dir / "merged").glob("*.ds"))]
    for f in merged:
        ends = np.asarray(f.ends, dtype=np.int64)[:-1]
        for tokens, loss in zip(np.split(np.asarray(f.tokens), ends), np.split(np.asarray(f.loss), ends), strict=True):
            assert tok.decode(tokens[:-1][loss[:-1] == 1].tolist()).strip() in {a.strip() for a in answers}
    in_dataset = sum(int(np.asarray(TokenFile(str(p)).loss).sum()) for p in (run_dir / "context").glob("*.ds"))
    data = report_data(Folder(str(run_dir)))
    total = data["build"]["tokens"]
    assert data["loss"]["tokens"] == in_dataset and published.record.tokens == total
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "ranks" / "_manifests").glob("*.json"))]
    shares = [r["counts"]["loss_tokens"] / r["counts"]["tokens"] for r in ranks]
    assert [row["loss_share"] for row in data["ranks"]] == pytest.approx(shares) and min(shares) > 0.3
    assert f'<td data-key="loss_tokens">{in_dataset:,} ({in_dataset / total:.1%})</td>' in render_html(data)
    assert ranks[0]["rendering"]["text"] == INSTRUCTION
    shown = {k: data["settings"][k] for k in ("template", "loss_fields", "messages_key", "loss_roles")}
    assert shown == {
        "template": INSTRUCTION,
        "loss_fields": "response",
        "messages_key": None,
        "loss_roles": "assistant",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, r"chat_template .*missing\.jinja"),
        ("{% for m in messages %}{{ m['content'] }", r"chat\.jinja: not a valid Jinja2 template: line 1"),
        ('{"eos_token": "</s>"}', r"chat\.jinja is JSON without a 'chat_template'"),
    ],
)
def test_a_chat_template_that_cannot_be_used_fails_the_plan(tmp_path, sample_corpus, sample_tokenizer, text, message):
    """Before the fan-out: no rank of a build starts with a template that cannot render anything."""
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.run import Build

    path = tmp_path / ("missing.jinja" if text is None else "chat.jinja")
    if text is not None:
        path.write_text(text)
    config = BuildConfig(
        input=str(sample_corpus),
        output=str(tmp_path / "out"),
        tokenizer=str(sample_tokenizer),
        messages_key="messages",
        chat_template=str(path),
    )
    with pytest.raises(UsageError, match=message):
        Build.start(config, "chat")
    assert not (tmp_path / "out").exists()


def test_a_chat_template_cannot_read_the_clock() -> None:
    """The same records give the same bytes on any day: Llama 3.1's template falls back to its fixed date."""
    dated = (
        "{% if strftime_now is defined %}{% set day = strftime_now('%d %b %Y') %}"
        "{% else %}{% set day = '26 Jul 2024' %}{% endif %}"
        "Today: {{ day }}\n{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    rendered = chat_template(dated, "llama31.jinja", "messages", ["assistant"]).render(
        {"messages": [{"role": "assistant", "content": "x"}]}
    )
    assert isinstance(rendered, Rendered), rendered
    assert rendered.text == "Today: 26 Jul 2024\nx" and rendered.loss_spans == [(19, 20)]


# Llama 3 Instruct's own chat template, as its tokenizer_config.json holds it.
LLAMA3_INSTRUCT = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LITERAL = " (a user may write <|eot_id|> or <|im_end|>)"


def llama3_config(folder: Path, **fields: str) -> Path:
    config = {"chat_template": LLAMA3_INSTRUCT, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps(config | fields))
    return path


def chatml_gpt2(folder: Path) -> Path:
    """GPT-2 with ChatML's markers as special tokens (no shared tokenizer has them), as ChatML fine-tunes add them."""
    tok = Tokenizer.from_file(str(shared_path("tokenizers", "gpt2", "tokenizer.json")))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def with_literal(chats: list[dict]) -> list[dict]:
    """The chats, the first with special-token text in its user's and its assistant's content."""
    first = json.loads(json.dumps(chats[0]))
    for message in first["messages"][1:]:
        message["content"] += LITERAL
    return [first, *chats[1:]]


def tokenize_chats(tmp_path: Path, chats: list[dict], tokenizer: Path, template: Path, eos: str, **options) -> dict:
    """The chats tokenized with both engines, which must agree byte for byte; the run on the default engine."""
    corpus = write_jsonl(tmp_path / "chats.jsonl", chats)
    common = {"messages_key": "messages", "chat_template": str(template), "save_loss": True, "eos_token": eos}
    results = {}
    for engine in ("auto", "hf"):
        out = tmp_path / engine
        results[engine] = run([corpus], out, tokenizer, engine=engine, shuffle_documents=False, **common, **options)
        assert results[engine]["counts"]["docs_written"] == len(chats)
    assert {p.name: p.read_bytes() for p in (tmp_path / "auto").glob("*.ds*")} == {
        p.name: p.read_bytes() for p in (tmp_path / "hf").glob("*.ds*")
    }
    assert results["auto"]["tokenizer"]["engine"] == "gigatoken"
    return results["auto"]


def assert_chat_encoding(
    output: Path, tokenizer: Path, texts: list[str], answers: list[str], turn_end: str, eos: str
) -> None:
    """Each document is HF's ids for its text with the special tokens read as such, then the EOS (the first
    document aside: its contents hold special-token text, see below); its loss tokens decode to the assistant's
    content, then ``turn_end`` (empty when the end of a turn carries no loss), then the EOS."""
    tok = Tokenizer.from_file(str(tokenizer))
    tok.encode_special_tokens = False  # as HF reads a chat template's text
    expected = tok.encode_batch_fast(texts[1:], add_special_tokens=False)
    docs = documents_with_loss(output)
    eos_id = tok.token_to_id(eos)
    assert [d.tolist() for d, _ in docs[1:]] == [[*e.ids, eos_id] for e in expected]
    for (tokens, loss), answer in zip(docs, answers, strict=True):
        assert tok.decode(tokens[loss == 1].tolist(), skip_special_tokens=False) == answer + turn_end + eos
    tokens = docs[0][0].tolist()
    assert tok.decode(tokens, skip_special_tokens=False) == texts[0] + eos
    marker = "<|eot_id|>" if "<|eot_id|>" in turn_end + texts[1] else "<|im_end|>"
    assert tokens.count(tok.token_to_id(marker)) == 3  # the template's, one a turn; the contents' are text
    tok.encode_special_tokens = True
    assert len(tok.encode(LITERAL, add_special_tokens=False).ids) > 10


def test_llama3_chats_get_special_markers_text_contents_and_loss_on_the_end_of_each_answer(tmp_path, instruct):
    """Issue 22, finding 7, on the shared instruct corpus with Llama 3's tokenizer and its own template: the
    markers the template writes are its special tokens (a user's literal <|eot_id|> stays text), the assistant's
    <|eot_id|> carries loss, and both engines give HF's ids."""
    llama3 = shared_path("tokenizers", "llama3")
    chats = with_literal([as_chat(r) for r in instruct[:300]])
    result = tokenize_chats(tmp_path, chats, llama3, llama3_config(tmp_path), "<|end_of_text|>")
    texts = [
        "<|begin_of_text|>"
        + "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>" for m in c)
        for c in (chat["messages"] for chat in chats)
    ]
    answers = [chat["messages"][2]["content"].strip() for chat in chats]
    assert_chat_encoding(tmp_path / "auto", llama3 / "tokenizer.json", texts, answers, "<|eot_id|>", "<|end_of_text|>")
    assert result["counts"]["special_token_literals"] == {"<|eot_id|>": 2}  # the contents' only
    assert result["rendering"]["loss_on_turn_end"] is True
    counted = count_tokens(
        CountConfig(
            inputs=[str(tmp_path / "chats.jsonl")],
            tokenizer=str(llama3),
            eos_token="<|end_of_text|>",
            messages_key="messages",
            chat_template=str(tmp_path / "tokenizer_config.json"),
        )
    )
    assert (counted.counts.tokens, counted.counts.loss_tokens) == (
        result["counts"]["tokens"],
        result["counts"]["loss_tokens"],
    )


@pytest.mark.parametrize("loss_on_turn_end", [True, False])
def test_chatml_chats_get_special_markers_and_loss_on_the_end_of_each_answer(tmp_path, instruct, loss_on_turn_end):
    """The same with ChatML's markers, and without loss on the end of a turn when asked."""
    tokenizer = chatml_gpt2(tmp_path)
    (tmp_path / "chat.jinja").write_text(CHATML)
    chats = with_literal([as_chat(r) for r in instruct[:300]])
    result = tokenize_chats(
        tmp_path, chats, tokenizer, tmp_path / "chat.jinja", GPT2_EOS, loss_on_turn_end=loss_on_turn_end
    )
    texts = [
        "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat["messages"]) for chat in chats
    ]
    answers = [chat["messages"][2]["content"] for chat in chats]
    turn_end = "<|im_end|>" if loss_on_turn_end else ""
    assert_chat_encoding(tmp_path / "auto", tokenizer, texts, answers, turn_end, GPT2_EOS)
    assert result["counts"]["special_token_literals"] == {"<|im_end|>": 2}


def test_mistral_chats_get_hfs_ids_with_its_prepended_spaces(tmp_path, instruct) -> None:
    """Mistral's normalizer prepends "▁" to each stretch of text between special tokens, as HF reads it: the
    template's </s> apart, the ids are still HF's (after the BOS its post-processor adds)."""
    mistral = shared_path("tokenizers", "mistral-7b")
    template = (
        "{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
        "{% else %} {{ m.content }}</s>{% endif %}{% endfor %}"
    )
    (tmp_path / "chat.jinja").write_text(template)
    chats = [{"messages": as_chat(r)["messages"][1:] * 2} for r in instruct[:200]]
    tokenize_chats(tmp_path, chats, mistral, tmp_path / "chat.jinja", "</s>")
    tok = Tokenizer.from_file(str(mistral / "tokenizer.json"))
    turn = {"user": "[INST] {} [/INST]", "assistant": " {}</s>"}
    texts = ["".join(turn[m["role"]].format(m["content"]) for m in chat["messages"]) for chat in chats]
    expected = [[*e.ids, tok.token_to_id("</s>")] for e in tok.encode_batch_fast(texts, add_special_tokens=True)]
    docs = documents_with_loss(tmp_path / "auto")
    assert [tokens.tolist() for tokens, _ in docs] == expected
    end = tok.token_to_id("</s>")
    for tokens, loss in docs:  # each turn's </s> carries loss, as do the EOS and the BOS
        assert np.count_nonzero(tokens == end) == 3 and loss[tokens == end].all() and loss[0] == 1


def test_a_template_that_writes_the_bos_its_tokenizer_adds_gives_one_bos(tmp_path, instruct) -> None:
    """Mistral's post-processor puts <s> before every document, and its chat templates write {{ bos_token }} too:
    a document starts with one <s>, as HF's apply_chat_template gives, never two."""
    mistral = shared_path("tokenizers", "mistral-7b")
    template = "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"
    config = {"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    chats = [{"messages": as_chat(r)["messages"][1:2]} for r in instruct[:20]]
    tokenize_chats(tmp_path, chats, mistral, tmp_path / "tokenizer_config.json", "</s>")
    bos = Tokenizer.from_file(str(mistral / "tokenizer.json")).token_to_id("<s>")
    for tokens, _ in documents_with_loss(tmp_path / "auto"):
        assert tokens[0] == bos and np.count_nonzero(tokens == bos) == 1


def test_a_tokenizer_that_reads_special_tokens_otherwise_apart_is_refused_for_chat_templates(tmp_path) -> None:
    """A Metaspace pre-tokenizer that prepends "▁" only at the start of a text: encoding the template's special
    tokens apart from the text around them would not give HF's ids, so the chat template is refused."""
    data = json.loads(shared_path("tokenizers", "mistral-7b", "tokenizer.json").read_text())
    metaspace = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    data |= {"normalizer": None, "pre_tokenizer": metaspace, "decoder": metaspace}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    (tmp_path / "chat.jinja").write_text(CHATML)
    config = TokenizeConfig(
        inputs=["x"], output="y", tokenizer=str(tmp_path), messages_key="m", chat_template=str(tmp_path / "chat.jinja")
    )
    with pytest.raises(UsageError, match=r"special token '<unk>' encodes otherwise.*--special-tokens-in-text special"):
        config.renderer(config.encoder())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"bos_token": "<|begin_of_text|>" * 600_000},
            r"its bos_token '<\|begin_of_text\|><\|begin_of_.*10200000 char",
        ),
        ({"eos_token": {"content": "</s>"}}, r"its eos_token '</s>' is not a special token of the tokenizer"),
    ],
)
def test_a_config_token_that_is_not_one_special_token_refuses_the_template(tmp_path, fields, message) -> None:
    """A 10 MB bos_token would be copied into every document: the template is refused before any data."""
    config = TokenizeConfig(
        inputs=["x"],
        output="y",
        tokenizer=str(shared_path("tokenizers", "llama3")),
        messages_key="messages",
        chat_template=str(llama3_config(tmp_path, **fields)),
    )
    with pytest.raises(UsageError, match=r"tokenizer_config\.json: " + message):
        config.renderer(config.encoder())


def test_special_token_text_outside_the_contents_is_quarantined() -> None:
    """A role is written among the template's own text, where its <|eot_id|> would become the control token."""
    renderer = chat_template(LLAMA3, "t", "messages", ["assistant"], special_tokens=["<|eot_id|>", "<s>"])
    evil = {"messages": [{"role": "user<|eot_id|>", "content": "x"}]}
    assert renderer.render(evil) == "special_token_text_outside_content"
    deep: object = "x"
    for _ in range(5000):
        deep = [deep]
    nested = renderer.render({"messages": [{"role": "user", "content": "x", "meta": deep}]})
    assert isinstance(nested, str), nested  # quarantined, no traceback
    assert nested.startswith("chat_template_error: maximum recursion depth exceeded")
    rendered = renderer.render({"messages": [{"role": "assistant", "content": "x <|eot_id|>"}]})
    assert isinstance(rendered, Rendered), rendered
    assert rendered.text.endswith("\n\nx <|eot_id|><|eot_id|>")
    assert rendered.special_spans is not None and rendered.loss_spans is not None
    assert [rendered.text[a:b] for a, b in rendered.special_spans] == ["<|eot_id|>"]  # the template's only
    assert [rendered.text[a:b] for a, b in rendered.loss_spans] == ["x <|eot_id|><|eot_id|>"]


HOSTILE = {  # template -> the reason its record is quarantined with
    "{{ 'x' * 1000000000 }}": "chat_template_output_too_large",
    "{{ 'x' * 100000 * 100000 }}": "chat_template_output_too_large",
    "{{ range(100000)|join * 10000 }}": "chat_template_output_too_large",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}": "chat_template_too_many_steps",
    "{% for i in range(10**5) %}{% for j in range(10**5) %}{{ i }}{% endfor %}{% endfor %}": (
        "chat_template_too_many_steps"
    ),
    "{% for a in messages[0].content %}{% for b in messages[0].content %}{% for c in messages[0].content %}"
    "{% endfor %}{% endfor %}{% endfor %}": "chat_template_too_many_steps",
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}": (
        "chat_template_too_many_steps"
    ),
    "{% set s %}{% for i in range(10**5) %}{% for j in range(10**5) %}x{% endfor %}{% endfor %}{% endset %}": (
        "chat_template_too_many_steps"
    ),
    "{{ 'x'.center(10**9) }}{{ 'x'.ljust(10**9) }}": "chat_template_output_too_large",
    "{{ 'x'.zfill(10**9) }}": "chat_template_output_too_large",
    "{{ [1] * 10**9 }}": "chat_template_output_too_large",
    "{% set a = ['x' * 1000] * 10000 %}{{ [a] * 10000 }}": "chat_template_output_too_large",
    "{{ '%1000000000s' % 'x' }}": "chat_template_output_too_large",
    "{{ '{:>1000000000}'.format('x') }}": "chat_template_output_too_large",
    "{{ '%*s'|format(10**9, 'x') }}": "chat_template_output_too_large",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}": (
        "chat_template_output_too_large"
    ),
    "{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}": (
        "chat_template_output_too_large"
    ),
    "{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}{% endfor %}": (
        "chat_template_output_too_large"
    ),
    "{{ 7 ** 100000000 }}": "chat_template_output_too_large",
    "{{ [1]|batch(10**9, 'x')|list }}{{ 'a\nb'|indent(10**9) }}": "chat_template_output_too_large",
    "{% set s = 'a' * 100000 %}{{ s.replace('a', s) }}": "chat_template_output_too_large",
    "{{ (1).to_bytes(10**9, 'big') }}": "chat_template_output_too_large",
    "{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}": "reserved_marker_characters",
}
HOSTILE_RUN = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from tokenization.rendering.renderer import chat_template
from tokenization.rendering.sandbox import Limits
record = {"messages": [{"role": "user\\ue0009\\ue001", "content": "a few words " * 50}]}
limits = Limits(steps=400_000)
renderers = [chat_template(t, "t", "messages", ["assistant"], limits=limits) for t in json.load(sys.stdin)]
rendered = [renderer.render(record) for renderer in renderers]
print(json.dumps([r if isinstance(r, str) else f"rendered {len(r.text)} characters" for r in rendered]))
"""


def test_hostile_templates_quarantine_their_records_within_a_memory_and_a_time_limit() -> None:
    """Issue 22, finding 6: under a 2 GiB address-space limit each hostile template's record is quarantined with
    its reason (none allocates first: 'x' * 10**9 alone would need 1 GB, most far more), and the process ends."""
    import subprocess
    import sys

    from tests.support.paths import ROOT

    done = subprocess.run(
        [sys.executable, "-c", HOSTILE_RUN],
        input=json.dumps(list(HOSTILE)),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert dict(zip(HOSTILE, json.loads(done.stdout), strict=True)) == HOSTILE


def test_a_template_over_its_limits_quarantines_only_the_records_that_reach_them(tmp_path, sample_tokenizer) -> None:
    """The limits are options: a record whose render builds more than ``render_max_chars`` is quarantined, with
    the reason, and the others are written."""
    template = "{% for m in messages %}{{ m.content * (1000 if m.role == 'evil' else 1) }}{% endfor %}"
    (tmp_path / "chat.jinja").write_text(template)
    good = [{"id": str(i), "messages": [{"role": "assistant", "content": "hello " * 10}]} for i in range(300)]
    evil = {"id": "evil", "messages": [{"role": "evil", "content": "hello " * 10}]}
    result = run(
        [write_jsonl(tmp_path / "in.jsonl", [*good, evil])],
        tmp_path / "out",
        sample_tokenizer,
        messages_key="messages",
        chat_template=str(tmp_path / "chat.jinja"),
        render_max_chars=10_000,
    )
    assert result["counts"]["rejected"] == {"chat_template_output_too_large": 1}
    assert result["counts"]["docs_written"] == 300
    assert result["rendering"]["render_max_chars"] == 10_000
