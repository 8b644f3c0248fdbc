"""Instruction and chat data: records rendered through a field template or a Jinja2 chat template into one
document, with loss only on the answer (a token carries loss when all its characters are in it), the EOS with
loss, and records that cannot be rendered quarantined with their reason."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.conftest import EOS, shared_path, write_jsonl
from tests.test_tokenize import run
from tokenization.count import CountConfig, count_tokens
from tokenization.errors import UsageError
from tokenization.formats.ds import TokenFile
from tokenization.rendering import chat_template, field_template, no_loss_ranges
from tokenization.tokenize import TokenizeConfig, TooManyRejects

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
        (tmp_path / "tokenizer_config.json").read_text(), "tokenizer_config.json", "messages", ["user", "assistant"]
    )
    rendered = renderer.render({"messages": messages})
    assert rendered.text.startswith("<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
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
    assert rendered.text == text
    assert [rendered.text[a:b] for a, b in rendered.loss_spans] == loss


def test_without_loss_fields_every_token_carries_loss_and_no_loss_ranges_still_apply() -> None:
    rendered = field_template(INSTRUCTION).render({"prompt": "Q?", "response": "A."})
    assert rendered.loss_spans is None
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
    bad = [{"id": "a", "prompt": "Q?"}, {"id": "b", "prompt": "Q?", "response": 7}, {"id": "c", "response": None}]
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
    options = {"template": INSTRUCTION, "loss_fields": "response"}
    counted = count_tokens(CountConfig(inputs=[str(corpus)], tokenizer=str(sample_tokenizer), eos_token=EOS, **options))
    tokenized = run([corpus], tmp_path / "out", sample_tokenizer, save_loss=True, **options)
    assert counted.counts.tokens == tokenized["counts"]["tokens"]
    assert counted.counts.loss_tokens == tokenized["counts"]["loss_tokens"] > 0
    assert counted.record["rendering"]["text"] == INSTRUCTION


def test_a_build_carries_the_mask_through_its_shuffles_and_reports_the_share_with_loss(
    tmp_path, sample_tokenizer
) -> None:
    """Rendered in the ranks, the mask moves with its tokens through the merge and the context windows; the
    report gives the share of tokens with loss, rank by rank and in all."""
    from tokenization.build import Build, BuildConfig
    from tokenization.report import render_html, report_data

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
    data = report_data(str(run_dir))
    assert data["loss"]["tokens"] == in_dataset and published.tokens == data["tokens"]
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "ranks" / "_manifests").glob("*.json"))]
    shares = [r["counts"]["loss_tokens"] / r["counts"]["tokens"] for r in ranks]
    assert [row["loss_share"] for row in data["ranks"]] == pytest.approx(shares) and min(shares) > 0.3
    assert f'<td data-key="loss_tokens">{in_dataset:,} ({in_dataset / data["tokens"]:.1%})</td>' in render_html(data)
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
    from tokenization.build import Build, BuildConfig

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
    assert rendered.text == "Today: 26 Jul 2024\nx" and rendered.loss_spans == [(19, 20)]
