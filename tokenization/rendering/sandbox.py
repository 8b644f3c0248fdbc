"""A Jinja2 sandbox whose renders are bounded in steps (so in time) and in the characters they build.

Jinja2's immutable sandbox keeps a template away from files and Python's internals, not from the machine's memory
and time: ``{{ 'x' * 10**9 }}`` allocates a gigabyte before any output exists, and nested loops with an empty body
never end. So every place where a template spends time or builds text is intercepted:

* time: each loop step, call and filter is a step of the render's budget (without them a template is
  straight-line code, as long as its text). Steps, not seconds: a clock would make whether a record is quarantined
  depend on the machine and its load, and a build's bytes must depend on its inputs and params alone;
* size: each operation that can build more than it is given (``*``, ``+``, ``%``, ``**``, ``~``, the padding and
  joining methods and filters, turning a list into text) works out its result's size from its operands, and is
  refused before it allocates when that passes what is left of the render's budget; what the other operations build
  is charged after them (at most a few times their input, charged already). Output, and the buffers of macros,
  blocks and ``{% set %}`` blocks, are charged as they grow.

A render past its steps raises :class:`RenderTooLong`, past its characters :class:`RenderTooLarge`; no template
can catch them. Filters no chat template needs, that cannot be bounded or that are not deterministic
(``pprint``, ``random``, ``urlize``, ``wordwrap``, ``xmlattr``) and the ``lipsum`` global are not offered.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sized
from typing import Any, AnyStr

from jinja2 import Template, nodes
from jinja2.ext import loopcontrols
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, _PassArg, pass_context
from jinja2.visitor import NodeTransformer

from tokenization.rendering.renderer import Limits

INT_BITS = 1 << 12  # an int a template builds: ample for any counter; * and ** on larger ones cost quadratic time
SMALL = 32  # characters of a value's text that is not a string, number or container (a float, None, a macro)
UNOFFERED_FILTERS = ("pprint", "random", "urlize", "wordwrap", "xmlattr")
LOOP_FILTER = "__ticking"  # the filter put around every loop's iterable (a template cannot name it: "__" is private)
JOIN_FILTER = "__joined"  # the filter that ``~`` becomes
PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
BRACE_FIELD = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")


class RenderLimit(Exception):
    """A render went past a limit; ``reason`` is the record's reject reason."""

    reason = "chat_template_limit"


class RenderTooLong(RenderLimit):
    reason = "chat_template_too_many_steps"


class RenderTooLarge(RenderLimit):
    reason = "chat_template_output_too_large"


class _Render(threading.local):
    """The render in progress on this thread: its steps left (None between renders) and characters left."""

    steps: int | None = None
    left = 0


def text_size(value: object, cap: int) -> int:
    """At most how many characters ``str(value)`` has, counted until past ``cap``: a list holding one string a
    million times is a few megabytes of pointers, but a million strings of text. Shared parts are walked once."""
    sizes: dict[int, int] = {}

    def size(v: object) -> int:
        if isinstance(v, (str, bytes)):
            return len(v) * (1 if isinstance(v, str) else 4) + 3
        if isinstance(v, int):
            return v.bit_length() // 3 + 2
        if isinstance(v, Namespace):
            v = object.__getattribute__(v, "_Namespace__attrs")
        if isinstance(v, range):
            return len(v) * (len(str(max(abs(v.start), abs(v.stop)))) + 3)
        if not isinstance(v, Collection):
            return SMALL
        if id(v) in sizes:
            return sizes[id(v)]
        if 3 * len(v) > cap:  # each item is at least a character and a separator: no need to walk them
            return 3 * len(v)
        total = 2
        for item in v.items() if isinstance(v, Mapping) else v:
            total += size(item) + 2
            if total > cap:
                return total
        sizes[id(v)] = total
        return total

    return size(value)


def _number(value: object, default: int = 0) -> int:
    """An argument that asks for a size (a width, a count): 0 when it is not a number."""
    return value if isinstance(value, int) else default


def format_size(fmt: str, args: object, cap: int) -> int:
    """At most how many characters ``fmt % args`` or ``fmt.format(...)`` has: its text, the widths and precisions
    its fields ask for (``*`` and nested fields take the largest number among the arguments) and, for each field,
    all of the arguments as text."""
    values = args.values() if isinstance(args, Mapping) else args if isinstance(args, (tuple, list)) else (args,)
    widest = max((_number(v) for v in values), default=0)
    each = text_size(args, cap)
    total = len(fmt)
    for field in [*PERCENT_FIELD.finditer(fmt), *BRACE_FIELD.finditer(fmt)]:
        spec = field.group(0)
        total += each + sum(map(int, re.findall(r"\d+", spec))) + (widest if "*" in spec or "{" in spec[1:] else 0)
    return total


def _items(value: Iterable[Any]) -> Collection[Any]:
    """An iterable as a collection, whose size is known before it is used (a generator is read once)."""
    return value if isinstance(value, Collection) else list(value)


def _replace_size(s: AnyStr, old: AnyStr, new: AnyStr, count: object = -1) -> int:
    found = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(s) + found * len(new)


# The size of what a str or bytes method returns, from its receiver and arguments, for those that can return more
# than a few times their receiver; the others are charged after.
METHOD_SIZES: dict[str, Callable[..., int]] = {
    "center": lambda s, width, *_: max(len(s), _number(width)),
    "ljust": lambda s, width, *_: max(len(s), _number(width)),
    "rjust": lambda s, width, *_: max(len(s), _number(width)),
    "zfill": lambda s, width: max(len(s), _number(width)),
    "expandtabs": lambda s, tabsize=8: len(s) * max(1, _number(tabsize)),
    "replace": _replace_size,
    "translate": lambda s, table: len(s) * max([1, *(len(v) for v in _values(table) if isinstance(v, str))]),
}


def _values(table: object) -> Iterable[Any]:
    return table.values() if isinstance(table, Mapping) else ()


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with every render bounded by :class:`Limits` (see the module's docstring). The
    bounds apply inside :meth:`bounded`; a template is compiled by :meth:`compile_bounded`."""

    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols], finalize=self._finalize)
        self.globals.pop("lipsum", None)
        self.filters = {
            name: self._bounded_filter(name, f) for name, f in self.filters.items() if name not in UNOFFERED_FILTERS
        }
        self.filters[LOOP_FILTER] = pass_context(lambda _, iterable: self._ticking(iterable))
        self.filters[JOIN_FILTER] = pass_context(lambda _, values: self._joined(values))
        self._render = _Render()

    # -- the budget of the render in progress, on this thread

    def bounded(self, limits: Limits, content_chars: int, parts: Callable[[], Iterator[str]]) -> str:
        """The text of ``parts()`` (a template's ``generate``), rendered within ``limits``."""
        state = self._render
        state.steps = limits.steps
        state.left = limits.chars + limits.per_content_char * content_chars
        try:
            out = []
            for part in parts():
                self.charge(len(part))
                out.append(part)
            return "".join(out)
        finally:
            state.steps = None

    def tick(self) -> None:
        """Spend one step of the render's budget."""
        state = self._render
        if state.steps is not None:
            state.steps -= 1
            if state.steps < 0:
                raise RenderTooLong()

    def charge(self, chars: int) -> None:
        """Spend ``chars`` of the render's budget, before they are built where that is known."""
        state = self._render
        if state.steps is None:
            return
        state.left -= chars
        if state.left < 0:
            raise RenderTooLarge()

    def _cap(self) -> int:
        return max(self._render.left, 0) + 1

    # -- the template's code, its operators, calls and output

    def compile_bounded(self, source: str) -> Template:
        """The template, with each loop's iterable spending a step as it yields and ``~`` bounded (Jinja2
        compiles both inline, out of reach of the sandbox's hooks)."""
        return self.from_string(_Bounded().visit(self.parse(source)))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and type(left) is str and type(right) is str:  # most of a chat template's operators
            self.charge(len(left) + len(right))
            return left + right
        self.charge(self._binop_size(operator, left, right))
        return super().call_binop(context, operator, left, right)

    def _binop_size(self, operator: str, left: Any, right: Any) -> int:
        ints = isinstance(left, int) and isinstance(right, int)
        if operator == "**" and ints and right > 0 and abs(left) > 1:
            return self._int_bits(left.bit_length() * right)
        if operator == "*" and ints:
            return self._int_bits(left.bit_length() + right.bit_length())
        sequences = (str, bytes, list, tuple)  # charged by characters or slots; a list's text is charged as text
        if operator == "*":
            seq, times = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, sequences) and isinstance(times, int):
                return len(seq) * max(times, 0)
        if operator == "+" and isinstance(left, sequences) and isinstance(right, sequences):
            return len(left) + len(right)
        if operator == "%" and isinstance(left, str):
            return format_size(left, right, self._cap())
        return 0

    def _int_bits(self, bits: int) -> int:
        if bits > INT_BITS:
            raise RenderTooLarge()
        return bits // 3

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (__self._ticking(args[0]), *args[1:])
        owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
        if isinstance(owner, (str, bytes)) and name == "join" and args:
            args = (_items(args[0]), *args[1:])
        estimate = __self._method_size(owner, name, args, kwargs)
        __self.tick()
        __self.charge(estimate or 0)
        result = super().call(__context, __obj, *args, **kwargs)
        if estimate is None:
            __self.charge(_allocated(result))
        return result

    def _method_size(self, owner: object, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        """The size of what a method returns, for the str, bytes and int methods that can build more than their
        receiver; None for the others."""
        if isinstance(owner, (str, bytes)) and name == "join" and args:
            return text_size(args[0], self._cap()) + len(owner) * len(args[0])
        if isinstance(owner, (str, bytes)) and name in METHOD_SIZES:
            return METHOD_SIZES[name](owner, *args, **kwargs)
        if isinstance(owner, int) and name == "to_bytes":
            return _number(args[0] if args else kwargs.get("length", 1))
        return None

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format`` and ``format_map``, charged the size their fields ask for first."""
        formatted = super().wrap_str_format(value)
        if formatted is None:
            return None
        fmt, by_map = value.__self__, value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            values = args[0] if by_map and args else (*args, *kwargs.values())
            self.charge(format_size(fmt, values, self._cap()))
            return formatted(*args, **kwargs)

        return bounded

    def _finalize(self, value: Any) -> Any:
        """Each ``{{ ... }}`` before it becomes text: a list's text can be far larger than the list."""
        self.charge(0 if isinstance(value, str) else text_size(value, self._cap()))
        return value

    def concat(self, parts: Iterable[str]) -> str:  # the buffers of macros and blocks
        parts = _items(parts)
        self.charge(sum(map(len, parts)))
        return "".join(parts)

    # -- filters

    def _bounded_filter(self, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        """``f``, spending a step, and charged its result's size before (when it can build more than its
        value) or after; a filter that turns its value into text is charged that text first."""
        estimate = FILTER_SIZES.get(name)
        textual = name in TEXT_FILTERS
        passed = _PassArg.from_obj(f)

        def lead(context: Context) -> tuple[Any, ...]:  # what the filter asks for before its value
            if passed is _PassArg.context:
                return (context,)
            if passed is _PassArg.eval_context:
                return (context.eval_ctx,)
            return (self,) if passed is _PassArg.environment else ()

        def bounded(context: Context, value: Any = None, *args: Any, **kwargs: Any) -> Any:
            if name in ("join", "sum"):
                value = _items(value)
            self.tick()
            cap = self._cap()
            if estimate is not None:
                self.charge(estimate(cap, value, *args, **kwargs))
            elif textual and not isinstance(value, str):
                self.charge(text_size(value, cap))
            result = f(*lead(context), value, *args, **kwargs)
            if estimate is None:
                self.charge(_allocated(result))
            return result

        return pass_context(bounded)

    def _ticking(self, iterable: Iterable[Any]) -> Iterable[Any]:
        return _Ticking(iterable, self.tick)

    def _joined(self, values: tuple[Any, ...]) -> str:
        """``a ~ b``: the operands' text, charged before it is built."""
        self.charge(sum(len(v) if isinstance(v, str) else text_size(v, self._cap()) for v in values))
        return "".join(map(str, values))


def _allocated(result: object) -> int:
    """Characters or slots a call's result holds, charged after it: its strings' characters, a container's slots
    (their contents, when shared with the data, are charged where they become text)."""
    return len(result) if isinstance(result, (str, bytes, list, tuple, dict, set)) else 0


def _nesting(value: object, seen: dict[int, int] | None = None) -> int:
    """How deep containers nest in ``value``: JSON indents each line by its depth."""
    seen = {} if seen is None else seen
    if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
        return 0
    if id(value) not in seen:
        seen[id(value)] = 1  # a cycle counts once
        items = value.values() if isinstance(value, Mapping) else value
        seen[id(value)] = 1 + max((_nesting(v, seen) for v in items), default=0)
    return seen[id(value)]


def _replace_filter_size(cap: int, s: object, old: object, new: object, count: object = None) -> int:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        return _replace_size(s, old, new, count)
    return text_size(s, cap) * (1 + text_size(new, cap)) + text_size(old, cap)


def _format_filter_size(cap: int, value: object, *args: object, **kwargs: object) -> int:
    if isinstance(value, str):
        return format_size(value, kwargs or args, cap)
    return text_size(value, cap) * (1 + text_size((args, kwargs), cap))


# The size of what a filter returns (a function of the budget left, its value and arguments) for the filters that
# can build more than their value, or loop on a count they are given; the others are charged after.
FILTER_SIZES: dict[str, Callable[..., int]] = {
    "center": lambda cap, value, width=80: text_size(value, cap) + _number(width),
    "indent": lambda cap, s, width=4, *_, **__: (
        text_size(s, cap) * (1 + (len(width) if isinstance(width, str) else _number(width)))
    ),
    "join": lambda cap, items, d="", *_: text_size(items, cap) + len(items) * text_size(d, cap),
    "replace": _replace_filter_size,
    "format": _format_filter_size,
    "batch": lambda cap, value, linecount, *_: _number(linecount),
    "slice": lambda cap, value, slices, *_: _number(slices),
    "sum": lambda cap, items, attribute=None, start=0: (
        0 if isinstance(start, (int, float)) else text_size(items, cap) * len(items)
    ),
    "tojson": lambda cap, value, indent=None: text_size(value, cap) * 6 * (1 + _number(indent) * _nesting(value)),
    "truncate": lambda cap, s, length=255, killwords=False, end="...", *_: text_size(s, cap) + text_size(end, cap),
}
# Filters that turn their value into text first (the others with a size above charge it themselves).
TEXT_FILTERS = frozenset(
    [
        "capitalize",
        "e",
        "escape",
        "forceescape",
        "lower",
        "safe",
        "string",
        "striptags",
        "title",
        "trim",
        "upper",
        "urlencode",
        "wordcount",
    ]
)


class _Ticking:
    """An iterable that spends a step before each item, and keeps its length for ``loop.length``."""

    def __init__(self, iterable: Iterable[Any], tick: Callable[[], None]):
        self.iterable, self.tick = iterable, tick

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable:
            self.tick()
            yield item

    def __len__(self) -> int:
        if not isinstance(self.iterable, Sized):
            raise TypeError("an iterable of unknown length")  # tells LoopContext to count the items itself
        return len(self.iterable)


class _Bounded(NodeTransformer):
    """Puts :data:`LOOP_FILTER` around each loop's iterable and makes ``~`` the :data:`JOIN_FILTER`."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, LOOP_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Filter:
        self.generic_visit(node)
        values = nodes.Tuple(node.nodes, "load", lineno=node.lineno)
        return nodes.Filter(values, JOIN_FILTER, [], [], None, None, lineno=node.lineno)
