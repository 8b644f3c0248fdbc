"""Records that are not one text field: several fields through a template, or chat messages through a Jinja2 chat
template, rendered into one document's text with the character spans that carry loss.

The encoder then holds out every token with a character outside those spans (a token that straddles a boundary
carries no loss), and the EOS keeps its loss: the spans' complement becomes the document's no-loss ranges, the
mechanism ``no_loss_ranges`` already uses, so shuffles, merges and context windows carry the mask unchanged.

A chat template's own text is known exactly (it is what lies between the contents), so the special tokens it
writes (``<|eot_id|>``) are handed to the encoder as ``special_spans``, each to become its special token, while
the contents stay under the special-token policy: a user's literal ``<|eot_id|>`` is text. The end of a turn with
loss, up to and including the first special token the template writes after its content, carries loss too, so
that a model learns to end its turn.

A record that cannot be rendered (a field missing or not a string, a message without role or content, a template
that raises or goes past its limits, see ``tokenization.rendering.sandbox``) is rejected with the reason, which names
the field; the reader quarantines it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tokenization.errors import UsageError

Spans = list[tuple[int, int]]
MISSING = object()
PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
ERROR_CHARS = 120  # of a template's error, in the reject reason (raise_exception's messages are fixed strings)
SHOWN_CHARS = 40  # of a bos_token or eos_token named in an error
# Each message's content is first rendered as a marker that no text holds (private-use code points), so that
# where the template puts it is known exactly; the real contents then replace the markers. A record whose text
# holds those code points is refused: its markers could not be told from the template's.
MARKER_CHARS = ("\ue000", "\ue001")
MARKER = re.compile("\ue000(\\d{1,9})\ue001")


@dataclass(frozen=True)
class Limits:
    """What one record's render may spend: steps (loop steps, calls and filters: 0.7 to 5 M a second here, by how
    much each does; a template takes tens a message), and characters, plus ``per_content_char`` for each character
    of its contents (a template copies each a few times: trimmed, joined, written; Llama 3's five)."""

    steps: int = 1_000_000
    chars: int = 1 << 24
    per_content_char: int = 8


class Reason(str):
    """Why a record cannot be rendered: its reject reason, told apart from a field's text by its type."""


@dataclass(frozen=True)
class Rendered:
    text: str
    loss_spans: Spans | None  # None: every character carries loss
    special_spans: Spans | None = None  # special-token text that the template wrote, each to be that token


@dataclass(frozen=True)
class Renderer:
    """Renders a record, or says why it cannot (the reject reason). ``source`` is the template's text, which the
    manifest records with its sha256."""

    kind: str  # "template" or "chat"
    source: str
    render: Callable[[dict[str, Any]], Rendered | str]
    loss: tuple[str, ...]  # the fields, or the roles, whose text carries loss
    settings: dict[str, Any] = field(default_factory=dict)  # how a chat template is applied, for the manifest

    @property
    def sha256(self) -> str:
        """Of the template's text: a plan records it, and a rank refuses to render with another."""
        return hashlib.sha256(self.source.encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.source, "sha256": self.sha256, "loss": list(self.loss), **self.settings}


def get_field(obj: dict[str, Any], key: str) -> object:
    """``obj[key]``, or a dotted path into nested objects (``meta.text``); :data:`MISSING` when absent."""
    if key in obj:
        return obj[key]
    value: object = obj
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def string_field(obj: dict[str, Any], key: str, name: str | None = None) -> str:
    """The field's text, or the :class:`Reason`: ``missing_{name}`` or ``{name}_not_string`` (``name``: the
    key)."""
    value = get_field(obj, key)
    name = name or key
    if value is MISSING or value is None:
        return Reason(f"missing_{name}")
    if not isinstance(value, str):
        return Reason(f"{name}_not_string")
    return value


def text_field(obj: dict[str, Any], key: str) -> Rendered | str:
    """The record's text from one field, every character with loss (``no_loss_ranges`` aside); its reasons are
    ``missing_text`` and ``text_not_string`` whatever the key."""
    text = string_field(obj, key, "text")
    return str(text) if isinstance(text, Reason) else Rendered(text, None)  # a plain str: orjson keys need one


def no_loss_ranges(loss_spans: Spans | None, length: int, extra: Spans | None) -> Spans | None:
    """The characters of a ``length``-character text that carry no loss: outside every loss span (when there are
    spans), and inside the record's own ``no_loss_ranges`` (``extra``)."""
    ranges = list(extra or [])
    if loss_spans is not None:
        at = 0
        for start, end in sorted(loss_spans):
            if start > at:
                ranges.append((at, start))
            at = max(at, end)
        if at < length:
            ranges.append((at, length))
    return ranges or None


def field_template(template: str, loss_fields: Iterable[str] = ()) -> Renderer:
    """``{field}`` placeholders (dotted for nested fields; ``{{`` and ``}}`` for braces) in literal text. With
    ``loss_fields``, only those fields' text carries loss; without, every token does."""
    parts: list[tuple[bool, str]] = []  # (is a field, its name or the literal text)
    at = 0
    for match in PLACEHOLDER.finditer(template):
        literal = template[at : match.start()]
        at = match.end()
        token = match.group(0)
        if token in ("{{", "}}"):
            parts.append((False, literal + token[0]))
            continue
        if match.group(1) is None or not match.group(1).strip():
            raise UsageError(
                f"template: {token!r} at character {match.start()} is not a {{field}} (write {{{{ or }}}})"
            )
        parts += [(False, literal), (True, match.group(1).strip())]
    parts.append((False, template[at:]))
    names = [name for is_field, name in parts if is_field]
    if not names:
        raise UsageError(f"template {template!r} names no {{field}}")
    loss = tuple(loss_fields)
    if unknown := [name for name in loss if name not in names]:
        raise UsageError(f"loss field {unknown[0]!r} is not in the template; its fields are {', '.join(names)}")

    def render(record: dict[str, Any]) -> Rendered | str:
        text: list[str] = []
        spans: Spans = []
        length = 0
        for is_field, name in parts:
            value = string_field(record, name) if is_field else name
            if isinstance(value, Reason):
                return str(value)
            if is_field and name in loss:
                spans.append((length, length + len(value)))
            text.append(value)
            length += len(value)
        return Rendered("".join(text), spans if loss else None)

    return Renderer("template", template, render, loss)


def read_chat_template(source: str, where: str) -> tuple[str, dict[str, str]]:
    """The Jinja2 text of a chat template file, or of a ``tokenizer_config.json``'s ``chat_template`` (its
    ``default`` one when it names several), with the config's ``bos_token`` and ``eos_token`` for the template."""
    try:
        config = orjson.loads(source)
    except orjson.JSONDecodeError:
        return source, {}
    if not isinstance(config, dict) or "chat_template" not in config:
        raise UsageError(f"{where} is JSON without a 'chat_template': give a Jinja2 file or a tokenizer_config.json")
    template = config["chat_template"]
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if not isinstance(template, str):
        raise UsageError(f"{where}: its chat_template is not a template")
    tokens = {}
    for key in ("bos_token", "eos_token"):
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            tokens[key] = value
    return template, tokens


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)


def _checked_tokens(tokens: dict[str, str], special_tokens: Sequence[str], where: str) -> dict[str, str]:
    """The config's ``bos_token`` and ``eos_token``, each a special token of the tokenizer (or empty): any other
    text would be copied into every document (a 10 MB ``bos_token``) and encoded as text."""
    for key, value in tokens.items():
        if value and value not in special_tokens:
            shown = value if len(value) <= SHOWN_CHARS else f"{value[:SHOWN_CHARS]}... ({len(value)} characters)"
            raise UsageError(
                f"{where}: its {key} {shown!r} is not a special token of the tokenizer; give a tokenizer_config.json "
                "that goes with the tokenizer, or a chat template file that writes its own markers"
            )
    return tokens


def chat_template(
    source: str,
    where: str,
    messages_key: str,
    loss_roles: Iterable[str],
    *,
    special_tokens: Sequence[str] = (),
    limits: Limits | None = None,
    loss_on_turn_end: bool = True,
    framed_bos: str = "",
) -> Renderer:
    """Chat records: ``messages_key`` holds a list of ``{role, content}`` messages, which a Jinja2 chat template
    (HF's conventions: ``messages``, ``bos_token``, ``eos_token``, ``add_generation_prompt``, ``raise_exception``;
    not ``strftime_now``) renders. The sandbox gives a template no file, network or attribute access beyond its
    data, and bounds each record's render by ``limits``. ``special_tokens``: the tokenizer's, found in the
    template's own text; ``loss_on_turn_end``: a turn with loss keeps it up to its first special token;
    ``framed_bos``: the BOS the encoder already puts before every document (its post-processor's), which the
    template's ``bos_token`` then leaves out, so that a document starts with one BOS, as HF's
    ``apply_chat_template`` gives."""
    import jinja2

    from tokenization.rendering.sandbox import BoundedEnvironment, RenderLimit  # Jinja2: ~0.3 s to import

    text, tokens = read_chat_template(source, where)
    limits = limits or Limits()
    if any(c in text or any(c in t for t in tokens.values()) for c in MARKER_CHARS):
        raise UsageError(f"{where}: the template holds the code points U+E000 or U+E001, which mark the contents")
    env = BoundedEnvironment()
    # No strftime_now, which HF offers: a build must not depend on the day it runs (Llama 3.1's template then
    # writes its fixed fallback date).
    env.globals["raise_exception"] = _raise
    try:
        template = env.compile_bounded(text)
    except jinja2.TemplateSyntaxError as exc:
        raise UsageError(f"{where}: not a valid Jinja2 template: line {exc.lineno}: {exc.message}") from None
    roles = tuple(loss_roles)
    context: dict[str, object] = {"bos_token": "", "eos_token": "", **_checked_tokens(tokens, special_tokens, where)}
    if framed_bos and context["bos_token"] == framed_bos:
        context["bos_token"] = ""
    context["add_generation_prompt"] = False
    ordered = sorted(set(special_tokens), key=lambda t: (-len(t), t))  # the longest first, as HF matches them
    specials = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def render(record: dict[str, Any]) -> Rendered | str:
        messages = get_field(record, messages_key)
        if messages is MISSING or messages is None:
            return f"missing_{messages_key}"
        if not isinstance(messages, list) or not messages:
            return f"{messages_key}_not_a_list_of_messages"
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return "message_without_role"
            if not isinstance(message.get("content"), str):
                return "message_without_content"
        marked = [message | {"content": f"\ue000{i}\ue001"} for i, message in enumerate(messages)]
        try:  # (deeply nested fields raise RecursionError on the way)
            if specials is not None and _outside_contents(messages, specials):
                return "special_token_text_outside_content"
            size = sum(len(message["content"]) for message in messages)
            written = env.bounded(limits, size, lambda: template.generate(messages=messages, **context))
            if any(c in written for c in MARKER_CHARS):
                return "reserved_marker_characters"
            pieces = MARKER.split(env.bounded(limits, size, lambda: template.generate(messages=marked, **context)))
        except RenderLimit as exc:
            return exc.reason
        except Exception as exc:  # whatever a template raises rejects the record, with the reason
            return f"chat_template_error: {str(exc)[:ERROR_CHARS]}"
        located = _located(written, pieces, messages, roles, specials, loss_on_turn_end)
        return located or "chat_template_changes_content"

    settings = {
        "loss_on_turn_end": loss_on_turn_end,
        "render_steps": limits.steps,
        "render_max_chars": limits.chars,
    }
    return Renderer("chat", text, render, roles, settings)


def _outside_contents(messages: list[dict[str, Any]], specials: re.Pattern[str]) -> bool:
    """Whether a message holds special-token text outside its content (a role ``<|eot_id|>``): the template writes
    it among its own text, where it would become the special token."""
    return any(
        specials.search(value if isinstance(value, str) else str(value))
        for message in messages
        for key, value in message.items()
        if key != "content"
    )


def _located(
    text: str,
    pieces: list[str],
    messages: list[dict[str, Any]],
    roles: tuple[str, ...],
    specials: re.Pattern[str] | None,
    turn_end: bool,
) -> Rendered | None:
    """The loss and special-token spans of ``text``: the markers in ``pieces`` (literal, message index, literal,
    ...) replaced by the contents, as is or stripped (templates often ``| trim`` them); None when neither gives
    ``text``. The special tokens are those in the literal pieces; with ``turn_end``, a content with loss keeps it
    up to the end of the first special token in the literal right after it."""
    if any(int(index) >= len(messages) for index in pieces[1::2]):
        return None  # a marker the template made up
    for shape in (str, str.strip):
        loss: list[list[int]] = []
        marks: Spans = []
        out: list[str] = []
        length = 0
        after_loss = False
        for k, piece in enumerate(pieces):
            if k % 2:
                message = messages[int(piece)]
                piece = shape(message["content"])
                after_loss = message["role"] in roles
                if after_loss:
                    loss.append([length, length + len(piece)])
            elif specials is not None:
                found = [(length + m.start(), length + m.end()) for m in specials.finditer(piece)]
                if turn_end and after_loss and found:
                    loss[-1][1] = found[0][1]
                marks += found
            out.append(piece)
            length += len(piece)
        if "".join(out) == text:
            return Rendered(text, [(a, b) for a, b in loss], marks or None)
    return None
