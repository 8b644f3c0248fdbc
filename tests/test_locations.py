"""Allowed locations: builds read and write only inside the deployment's prefixes, never over http(s)."""

from __future__ import annotations

import pytest

from tokenization.locations import AllowedLocations, LocationError


@pytest.fixture
def allowed(tmp_path) -> AllowedLocations:
    return AllowedLocations.parse(f"{tmp_path}/builds, s3://corpus/builds\n s3://corpus/clean")


@pytest.mark.parametrize(
    ("location", "ok"),
    [
        ("{tmp}/builds", True),
        ("{tmp}/builds/nightly/run", True),
        ("file://{tmp}/builds/x", True),
        ("{tmp}/builds/../secrets", False),
        ("{tmp}/buildsX", False),
        ("/etc", False),
        ("../../", False),
        ("s3://corpus/builds/2026", True),
        ("s3://corpus/builds/../private", False),
        ("s3://corpus/../other-bucket", False),
        ("s3://corpus/clean/*.jsonl.gz", True),
        ("s3://corpus", False),
        ("http://127.0.0.1:8765/secret/index.html?x=", False),
        ("https://corpus/builds", False),
        ("memory://corpus/builds", False),
    ],
)
def test_only_locations_inside_a_prefix_are_allowed(allowed, tmp_path, location, ok) -> None:
    assert allowed.allows(location.format(tmp=tmp_path)) is ok


def test_a_symlink_out_of_a_prefix_is_not_inside_it(allowed, tmp_path) -> None:
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "escape").symlink_to("/etc")
    assert not allowed.allows(f"{tmp_path}/builds/escape/passwd")


def test_refusals_name_the_param_and_the_setting(allowed) -> None:
    with pytest.raises(LocationError, match=r"^param output: http://x/y: http:// is not a storage"):
        allowed.check("output", "http://x/y")
    with pytest.raises(LocationError, match=r"^param input: /etc/passwd is outside .*TOKENIZATION_ALLOWED_LOCATIONS"):
        allowed.check("input", "/etc/passwd")
    allowed.check("output", "s3://corpus/builds")
