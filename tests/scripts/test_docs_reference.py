"""The reference pages the docs hook writes name every route, command and setting the code has."""

from __future__ import annotations

import pytest
import typer

from app.cli import cli
from scripts import docs_reference
from settings import Settings


def test_settings_reference_lists_every_setting_with_its_comment():
    text = docs_reference.settings_reference()
    for name in Settings.model_fields:
        assert f"`SQA_{name.upper()}`" in text
    assert "All state lives under one directory" in text  # SQA_HOME's comment, read from the source


def test_http_reference_lists_every_route_of_the_schema():
    schema = docs_reference.openapi_schema()
    text = docs_reference.http_api()
    for path, methods in schema["paths"].items():
        for method in methods:
            assert f"`{method.upper()} {path}`" in text
    assert "### AnswerRequest" in text


def test_cli_reference_lists_every_command_and_subcommand():
    text = docs_reference.cli_reference()
    root = typer.main.get_command(cli)
    for name, command in root.commands.items():
        assert f"`sqa {name}`" in text
        for sub in getattr(command, "commands", {}):
            assert f"`sqa {name} {sub}`" in text


def test_a_page_without_its_marker_is_refused():
    with pytest.raises(ValueError, match="generated: cli"):
        docs_reference.render("# Command line\n\nno marker here\n", "cli")
    assert "sqa ingest" in docs_reference.render("# Command line\n\n<!-- generated: cli -->\n", "cli")
