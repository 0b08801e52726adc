"""Sources → text → chunks, each chunk keeping its provenance (file, page or heading, chunk id, character range).

Readers, all offline: .txt and .md as they are (a Markdown heading names the chunks under it); .html through the
standard library's html.parser (script and style dropped, h1-h6 kept as headings); .pdf through pypdf, a page at a
time (an encrypted file, a damaged one, or one whose pages hold no text, such as a scan, is a UserError saying so);
.docx through python-docx (paragraphs, Heading styles as headings). A folder is read file by file, sorted.

Seed prompts for the `answer` task: .jsonl rows with `prompt`, `question` or `messages` (the last user turn), .csv
with a `prompt` or `question` column, .txt one prompt a line.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from tunestudio.worker.errors import UserError

__all__ = ["DOCUMENT_SUFFIXES", "PROMPT_SUFFIXES", "Chunk", "Prompt", "Section", "chunk_sections", "files_of",
           "read_document", "read_prompts"]

DOCUMENT_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf", ".docx")
PROMPT_SUFFIXES = (".jsonl", ".csv", ".txt")
_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


@dataclass(frozen=True)
class Section:
    """A stretch of a document's text under one heading (or on one PDF page)."""

    file: str
    text: str
    page: int | None = None
    heading: str | None = None


@dataclass(frozen=True)
class Chunk:
    """What one request is grounded in: `chunk_size` characters of a section at most, and where they came from."""

    file: str
    chunk: int  # the chunk's number in its file, from 0
    start: int  # character range in the section's text
    end: int
    text: str
    page: int | None = None
    heading: str | None = None

    @property
    def key(self) -> str:
        return f"{self.file}#{self.chunk}"

    def provenance(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "text"}


@dataclass(frozen=True)
class Prompt:
    """A user's own prompt (the `answer` task), and where it came from."""

    file: str
    line: int  # 1-based, as an editor shows it
    text: str
    system: str | None = None

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}"


def files_of(sources: list[str], suffixes: tuple[str, ...]) -> list[Path]:
    """The files the sources name: a file as given, a folder's files with a known suffix (sorted, recursively)."""
    found: list[Path] = []
    for raw in sources:
        path = Path(raw)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in suffixes
                            and not p.name.startswith("."))
        elif path.suffix.lower() in suffixes:
            found.append(path)
        else:
            raise UserError(f"{path}: a {path.suffix or 'file without a suffix'} is not read here (the readers take "
                            f"{', '.join(suffixes)})")
    if not found:
        raise UserError(f"the sources hold no file to read ({', '.join(suffixes)})")
    return found


def read_document(path: Path) -> list[Section]:
    """The document's text as sections; UserError naming the file when it cannot be read or holds no text."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".pdf":
            sections = _pdf(path)
        elif suffix == ".docx":
            sections = _docx(path)
        elif suffix in (".html", ".htm"):
            sections = _html(path)
        else:
            sections = _markdown(path, path.read_text(encoding="utf-8", errors="replace"))
    except UserError:
        raise
    except Exception as exc:  # a damaged file: any library's error, named with the file
        raise UserError(f"{path}: cannot be read as {suffix} ({type(exc).__name__}: {exc})") from exc
    sections = [s for s in sections if s.text.strip()]
    if not sections:
        hint = " (a scanned PDF has images of pages and no text: run OCR on it first)" if suffix == ".pdf" else ""
        raise UserError(f"{path}: holds no text{hint}")
    return sections


def _markdown(path: Path, text: str) -> list[Section]:
    sections, heading, lines = [], None, []
    for line in text.splitlines():
        found = _MD_HEADING.match(line)
        if found:
            sections.append(Section(str(path), "\n".join(lines).strip(), heading=heading))
            heading, lines = found.group(2), []
        lines.append(line)
    sections.append(Section(str(path), "\n".join(lines).strip(), heading=heading))
    return sections


def _pdf(path: Path) -> list[Section]:
    from pypdf import PdfReader

    reader = PdfReader(str(path))
    if reader.is_encrypted:
        raise UserError(f"{path}: the PDF is encrypted; save a copy without a password first")
    return [Section(str(path), (page.extract_text() or "").strip(), page=number)
            for number, page in enumerate(reader.pages, 1)]


def _docx(path: Path) -> list[Section]:
    import docx

    sections, heading, lines = [], None, []
    for paragraph in docx.Document(str(path)).paragraphs:
        style = paragraph.style.name if paragraph.style is not None else ""
        if style.startswith(("Heading", "Title")) and paragraph.text.strip():
            sections.append(Section(str(path), "\n".join(lines).strip(), heading=heading))
            heading, lines = paragraph.text.strip(), []
        lines.append(paragraph.text)
    sections.append(Section(str(path), "\n".join(lines).strip(), heading=heading))
    return sections


class _Text(HTMLParser):
    """An HTML page's visible text, cut into sections at its headings."""

    SKIPPED = frozenset({"script", "style", "noscript", "template", "head"})
    BLOCKS = frozenset({"p", "div", "li", "br", "tr", "section", "article", "pre", "blockquote", "ul", "ol", "table"})

    def __init__(self, file: str) -> None:
        super().__init__(convert_charrefs=True)
        self.file, self.sections = file, []
        self.heading: str | None = None
        self.parts: list[str] = []
        self.skipping, self.in_heading = 0, False
        self.heading_parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in self.SKIPPED:
            self.skipping += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self._close()
            self.in_heading, self.heading_parts = True, []
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif re.fullmatch(r"h[1-6]", tag) and self.in_heading:
            self.in_heading = False
            self.heading = " ".join("".join(self.heading_parts).split()) or None
            self.parts.append(f"{self.heading or ''}\n")

    def handle_data(self, data: str) -> None:
        if self.skipping:
            return
        (self.heading_parts if self.in_heading else self.parts).append(data)

    def _close(self) -> None:
        text = "\n".join(" ".join(line.split()) for line in "".join(self.parts).splitlines())
        self.sections.append(Section(self.file, re.sub(r"\n{2,}", "\n\n", text).strip(), heading=self.heading))
        self.parts = []

    def close(self) -> None:
        super().close()
        self._close()


def _html(path: Path) -> list[Section]:
    parser = _Text(str(path))
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    return parser.sections


def chunk_sections(sections: list[Section], size: int, overlap: int) -> Iterator[Chunk]:
    """Each section cut into pieces of `size` characters at most that share `overlap`, preferring to end at a
    paragraph, line or sentence break in the piece's last fifth; numbered per file."""
    numbers: dict[str, int] = {}
    for section in sections:
        text, start = section.text, 0
        while start < len(text):
            end = _break(text, start, size)
            number = numbers.get(section.file, 0)
            numbers[section.file] = number + 1
            yield Chunk(section.file, number, start, end, text[start:end], section.page, section.heading)
            if end >= len(text):
                break
            start = max(end - overlap, start + 1)


def _break(text: str, start: int, size: int) -> int:
    end = min(start + size, len(text))
    if end == len(text):
        return end
    floor = start + size * 4 // 5
    for mark in ("\n\n", "\n", ". "):
        at = text.rfind(mark, floor, end)
        if at > start:
            return at + len(mark)
    return end


def read_prompts(path: Path) -> list[Prompt]:
    """The prompts of a seed file; UserError naming the file and row when one has no prompt."""
    suffix = path.suffix.lower()
    text = path.read_text(encoding="utf-8", errors="replace")
    if suffix == ".txt":
        return [Prompt(str(path), n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if suffix == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
        column = next((c for c in ("prompt", "question") if rows and c in rows[0]), None)
        if column is None:
            raise UserError(f"{path}: a seed CSV needs a 'prompt' or 'question' column")
        return [Prompt(str(path), n, row[column].strip()) for n, row in enumerate(rows, 2) if row[column].strip()]
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompts.append(_prompt_of(str(path), n, json.loads(line)))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise UserError(f"{path} row {n}: no prompt ({exc}); a row has 'prompt', 'question' or 'messages'") \
                from None
    return prompts


def _prompt_of(file: str, line: int, row: dict[str, Any]) -> Prompt:
    for name in ("prompt", "question", "instruction"):
        if isinstance(row.get(name), str) and row[name].strip():
            return Prompt(file, line, row[name].strip())
    messages = row["messages"]
    system = next((m["content"] for m in messages if m.get("role") == "system"), None)
    user = [m["content"] for m in messages if m.get("role") == "user"]
    if not user or not isinstance(user[-1], str) or not user[-1].strip():
        raise ValueError("no user turn")
    return Prompt(file, line, user[-1].strip(), system)
