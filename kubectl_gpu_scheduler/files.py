"""Reading manifests as `kubectl apply -f` does: files, directories, `-` for stdin, YAML (several
documents, `---`) or JSON. Errors name the file and the document, and the line for YAML syntax."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import yaml

MAX_BYTES = 32 * 1024 * 1024  # per file: bounded memory on any input
EXTENSIONS = (".yaml", ".yml", ".json")
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class InputError(ValueError):
    """A file that cannot be read as manifests; the message names the file and where."""


@dataclass(frozen=True)
class Document:
    source: str  # the path as given, or "-" for stdin
    number: int  # 1-based, counting every `---`-separated document
    content: Any


def _read(stream: BinaryIO, source: str) -> str:
    data = stream.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise InputError(f"{source}: larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise InputError(f"{source}: not UTF-8 text (byte {error.start})") from None


def shown(source: str) -> str:
    return "stdin" if source == "-" else source


def documents(text: str, source: str) -> list[Document]:
    found: list[Document] = []
    try:
        for content in yaml.load_all(text, Loader=Loader):
            found.append(Document(source, len(found) + 1, content))
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join(filter(None, (error.context, error.problem)))
        raise InputError(f"{shown(source)}: document {len(found) + 1}: invalid YAML at {where}{problem}") from None
    except (yaml.YAMLError, RecursionError) as error:
        raise InputError(f"{shown(source)}: document {len(found) + 1}: invalid YAML: {error}") from None
    return found


def read(paths: list[str], stdin: BinaryIO | None = None) -> list[Document]:
    """Every document of every file, in order. `-` reads stdin; a directory, its YAML and JSON
    files (not recursively), as kubectl does."""
    found: list[Document] = []
    for given in paths:
        if given == "-":
            found += documents(_read(stdin or sys.stdin.buffer, "stdin"), "-")
            continue
        path = Path(given)
        if path.is_dir():
            members = sorted(p for p in path.iterdir() if p.suffix in EXTENSIONS and p.is_file())
            if not members:
                raise InputError(f"{given}: a directory with no .yaml, .yml or .json file")
        else:
            members = [path]
        for member in members:
            name = str(member) if path.is_dir() else given
            try:
                with member.open("rb") as stream:
                    text = _read(stream, name)
            except OSError as error:
                raise InputError(f"{name}: {error.strerror or error}") from None
            found += documents(text, name)
    return found
