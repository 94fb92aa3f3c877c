"""mkdocs hook: the reference pages written from the code at build time, so they cannot drift.

Each reference page (docs/reference/*.md) holds a hand-written introduction and one marker line,
`<!-- generated: NAME -->`, that this hook replaces with the generated text:

- `http-api`: every route of the OpenAPI schema (`app.main.create_app().openapi()`), its parameters,
  body and responses, then the schemas;
- `cli`: every `sqa` command and group (`app.cli.cli`), with its help and each option's help, as
  `--help` prints them;
- `settings`: every field of `settings.Settings` as its SQA_* variable, with its type, default and
  the comment written above it in settings/__init__.py;
- `changelog`: CHANGELOG.md of the repository root (docs/changelog.md shows it on the site).

A page that lost its marker fails the build (strict), and so does a generator that raises.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
import tempfile
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # mkdocs runs from the root, but a hook is loaded by file path
    sys.path.insert(0, str(ROOT))

# The project's modules, importable once ROOT is on the path (app.main, which loads the services, is
# imported where the schema is made).
import settings  # noqa: E402
from app.cli import cli  # noqa: E402
from settings import Settings  # noqa: E402

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def cell(text: object) -> str:
    """A Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# --- HTTP API -------------------------------------------------------------------------------------


def openapi_schema() -> dict[str, Any]:
    from app.main import create_app  # noqa: PLC0415 (lazy: app.main pulls the services and faiss)

    with tempfile.TemporaryDirectory() as home:  # the schema needs no state: the lifespan never runs
        return create_app(Settings(home=Path(home))).openapi()


def schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(schema_type(s) for s in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {schema_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    return str(kind) + (f" ({schema['format']})" if "format" in schema else "")


def route_text(path: str, method: str, op: dict[str, Any]) -> list[str]:
    out = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        out += [f"**{op['summary']}**", ""]
    if op.get("description"):
        out += [op["description"].strip(), ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
        for p in params:
            out.append(
                f"| `{p['name']}` | {p['in']} | {cell(schema_type(p.get('schema', {})))} | "
                f"{'yes' if p.get('required') else 'no'} | {cell(p.get('description', ''))} |"
            )
        out.append("")
    body = op.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        out += [f"Body ({media}): {schema_type(content.get('schema', {}))}", ""]
    responses = op.get("responses", {})
    if responses:
        out += ["| status | meaning |", "| --- | --- |"]
        for code, response in responses.items():
            out.append(f"| {code} | {cell(response.get('description', ''))} |")
        out.append("")
    return out


def http_api() -> str:
    schema = openapi_schema()
    out = [f"OpenAPI {schema.get('openapi', '')}, `{schema['info']['title']}` {schema['info'].get('version', '')}.", ""]
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            out += route_text(path, method, op)
    out += ["## Schemas", ""]
    for name, comp in schema.get("components", {}).get("schemas", {}).items():
        out += [f"### {name}", ""]
        if comp.get("description"):
            out += [comp["description"].strip(), ""]
        props = comp.get("properties", {})
        if props:
            required = set(comp.get("required", []))
            out += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
            for field, spec in props.items():
                out.append(
                    f"| `{field}` | {cell(schema_type(spec))} | {'yes' if field in required else 'no'} | "
                    f"{cell(spec.get('description', ''))} |"
                )
            out.append("")
    return "\n".join(out)


# --- command line ---------------------------------------------------------------------------------


def command_text(name: str, command: Any, depth: int) -> list[str]:
    ctx = command.make_context(name, [], resilient_parsing=True)
    heading = "#" * min(depth + 2, 6)
    out = [f"{heading} `{name}`", ""]
    if command.help:
        out += [inspect.cleandoc(command.help), ""]
    usage = " ".join(command.collect_usage_pieces(ctx))
    out += ["```", f"{name} {usage}".rstrip(), "```", ""]
    rows = [p.get_help_record(ctx) for p in command.params]
    args = [p for p in command.params if p.param_type_name == "argument"]
    if args:
        out += ["Arguments: " + ", ".join(f"`{a.name.upper()}`" for a in args), ""]
    rows = [r for r in rows if r]
    if rows:
        out += ["| option | description |", "| --- | --- |"]
        out += [f"| `{cell(opts)}` | {cell(text)} |" for opts, text in rows]
        out.append("")
    for sub_name in getattr(command, "commands", {}):
        out += command_text(f"{name} {sub_name}", command.commands[sub_name], depth + 1)
    return out


def cli_reference() -> str:
    root = typer.main.get_command(cli)
    out = [inspect.cleandoc(root.help or ""), ""]
    for name in root.commands:
        out += command_text(f"sqa {name}", root.commands[name], 0)
    return "\n".join(out)


# --- settings -------------------------------------------------------------------------------------


def field_comments() -> dict[str, str]:
    """Each Settings field's comment: the comment lines right above it, and one at its line's end."""
    source = Path(settings.__file__).read_text(encoding="utf-8")
    lines = source.splitlines()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    out = {}
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        above = []
        i = node.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            above.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        tail = lines[node.end_lineno - 1].split("  # ", 1)
        if len(tail) == 2:
            above.append(tail[1].strip())
        out[node.target.id] = " ".join(above)
    return out


def type_name(annotation: Any) -> str:
    """`int`, `str or None`, or a Literal's choices (`cpu` \\| `cuda`)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(f"`{a}`" for a in args)
    if args:
        return " or ".join(type_name(a) for a in args)
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def settings_reference() -> str:
    comments = field_comments()
    out = ["| variable | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        kind = type_name(field.annotation)
        default = field.get_default(call_default_factory=False) if field.default_factory is None else "(computed)"
        shown = json.dumps(str(default)) if isinstance(default, Path) else json.dumps(default, default=str)
        out.append(f"| `SQA_{name.upper()}` | {cell(kind)} | `{cell(shown)}` | {cell(comments.get(name, ''))} |")
    return "\n".join(out)


def changelog() -> str:
    """CHANGELOG.md of the repository root, its links made relative to docs/ (one text, two places)."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").split("\n", 1)[1]  # the page has its own title
    return text.replace("](docs/", "](")


GENERATORS: dict[str, Callable[[], str]] = {
    "http-api": http_api,
    "cli": cli_reference,
    "settings": settings_reference,
    "changelog": changelog,
}
PAGES = {
    "reference/http-api.md": "http-api",
    "reference/cli.md": "cli",
    "reference/settings.md": "settings",
    "changelog.md": "changelog",
}


def render(markdown: str, expected: str) -> str:
    """The page with its marker replaced by the generated text; ValueError if the marker is missing."""
    found = MARKER.findall(markdown)
    if found != [expected]:
        raise ValueError(f"the page must hold exactly one marker '<!-- generated: {expected} -->' (found {found})")
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    expected = PAGES.get(page.file.src_path)
    if expected is None:
        return markdown

    try:
        return render(markdown, expected)
    except Exception as exc:  # noqa: BLE001  (any failure fails the build, with its page named)
        raise PluginError(f"{page.file.src_path}: {exc}") from exc
