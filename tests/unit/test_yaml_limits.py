"""metalmend.yamlsafe: PyYAML's safe loader's results within the limits, and every
limit refused before the body is composed, whatever its size (no C recursion: a nesting
bomb here would kill the test process with SIGSEGV if libyaml composed it)."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from metalmend import yamlsafe
from metalmend.yamlsafe import YamlLimits, YamlRefused


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\nb: [x, 2.5, true, null, ~, 0x1f, 1_000]\nc: {d: 'e'}\n",
        "--- 1\n--- [a]\n---\n--- {a: b}\n",  # an empty document included
        "a: &x {k: v}\nb: *x\nc: {<<: *x, l: w}\n",  # anchors, aliases, merge keys
        "a: !!str 12\nb: !!int '7'\nc: !!float 1\nd: 2026-11-23\ne: !!binary aGk=\n",
        "a: |\n  text\n  lines\nb: >\n  folded\n  text\n",
        '{"json": [1, 2, {"x": null}]}',
    ],
)
def test_results_are_pyyamls_safe_loaders(text: str) -> None:
    assert yamlsafe.load_all(text) == list(yaml.safe_load_all(text))


def test_documents_keep_dates_as_the_strings_they_were_written_as() -> None:
    documents = yamlsafe.documents("d: 2026-11-23\n", loader=yamlsafe.DocumentLoader)
    assert [value for _, _, value in documents] == [{"d": "2026-11-23"}]
    assert yamlsafe.load_all("d: 2026-11-23") == [{"d": dt.date(2026, 11, 23)}]


def laughs(levels: int, width: int = 9) -> str:
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        name, previous = chr(ord("a") + i), chr(ord("a") + i - 1)
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * width)}]")
    return "\n".join(lines)


SMALL = YamlLimits(depth=5, documents=3, document_values=20, values=50, characters=100)


@pytest.mark.parametrize(
    ("text", "limits", "expected"),
    [
        pytest.param("[" * 32_000 + "]" * 32_000, None,
                     "document 1 (line 1): nested deeper than 100 levels (at line 1, column 101)",
                     id="flow-nesting-bomb-32k"),
        pytest.param("[" * 200_000 + "]" * 200_000, None, "nested deeper than 100 levels",
                     id="flow-nesting-bomb-200k"),
        pytest.param("- " * 200_000 + "x", None, "nested deeper than 100 levels",
                     id="block-nesting-bomb"),
        pytest.param("{a: " * 200_000 + "1" + "}" * 200_000, None,
                     "nested deeper than 100 levels", id="mapping-nesting-bomb"),
        pytest.param(laughs(9), None, "more than 500000 values once YAML aliases are expanded",
                     id="billion-laughs"),
        pytest.param("a: &a [*a]", None, "the alias *a is inside the value it names",
                     id="self-reference"),
        pytest.param("a: &s " + "x" * 60 + "\nb: [*s, *s]", SMALL,
                     "more than 100 characters of text once YAML aliases are expanded",
                     id="long-string-repeated"),
        pytest.param("[[[[[[1]]]]]]", SMALL, "nested deeper than 5 levels", id="depth"),
        pytest.param("--- 1\n--- 2\n--- 3\n--- 4\n", SMALL, "more than 3 documents in one body",
                     id="documents"),
        pytest.param("---\n[]\n---\n---\n---\n", SMALL, "more than 3 documents in one body",
                     id="empty-documents-count"),
        pytest.param("[" + "1," * 20 + "1]", SMALL, "document 1 (line 1): more than 20 values"
                     " in one document", id="values-per-document"),
        pytest.param("".join(f"--- [{'1,' * 17}1]\n" for _ in range(3)), SMALL,
                     "document 3 (line 3): the body holds more than 50 values", id="values"),
    ],
)  # fmt: skip
def test_each_limit_is_refused_saying_which_and_where(
    text: str, limits: YamlLimits | None, expected: str
) -> None:
    with pytest.raises(YamlRefused) as refused:
        yamlsafe.load_all(text, limits)
    assert expected in str(refused.value)
    assert isinstance(refused.value, yaml.YAMLError)  # callers catching YAML errors see it


@pytest.mark.parametrize(
    ("text", "limits"),
    [
        ("[" * 100 + "]" * 100, None),  # exactly the depth limit
        (laughs(5), None),  # 9**5 = 59,049 values: aliases within the limit are fine
        ("a: &s " + "x" * 40 + "\nb: *s", SMALL),
        ("--- 1\n--- 2\n--- 3\n", SMALL),
    ],
)
def test_bodies_within_the_limits_are_read(text: str, limits: YamlLimits | None) -> None:
    assert yamlsafe.load_all(text, limits) == list(yaml.safe_load_all(text))


def test_an_undefined_alias_or_a_duplicate_anchor_is_a_yaml_error() -> None:
    for text in ("a: *nowhere", "a: &x 1\nb: &x 2"):
        with pytest.raises(yaml.YAMLError):
            yamlsafe.load_all(text)
