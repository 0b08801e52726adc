"""Sources → text → chunks (tunestudio/worker/make_data/documents.py), on the bundled documents that
tunestudio/worker/tiny_docs.py writes with fpdf2 and python-docx."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tunestudio.worker.errors import UserError
from tunestudio.worker.make_data import chunk_sections, files_of, read_document, read_prompts
from tunestudio.worker.make_data.documents import DOCUMENT_SUFFIXES, Section
from tunestudio.worker.tiny_docs import PROMPTS, TOPICS, write_docs


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_docs(tmp_path_factory.mktemp("docs"))


def _words(text: str) -> list[str]:
    return text.split()


@pytest.mark.parametrize("suffix", ["md", "html", "pdf", "docx"])
def test_every_bundled_document_round_trips_through_its_reader(docs: dict[str, Path], suffix: str) -> None:
    sections = read_document(docs[suffix])
    text = " ".join(s.text for s in sections)
    for _heading, paragraphs in TOPICS:
        for paragraph in paragraphs:  # every word, in order (a PDF breaks lines where it wraps)
            assert " ".join(_words(paragraph)) in " ".join(_words(text)), (suffix, paragraph[:40])
    assert "var x" not in text  # an HTML page's script is no text
    if suffix == "pdf":
        assert [s.page for s in sections] == [1, 2, 3, 4]  # a page per topic
    else:
        assert [s.heading for s in sections if s.heading in dict(TOPICS)] == [h for h, _ in TOPICS]


def test_chunks_keep_their_provenance_and_overlap() -> None:
    text = ("word " * 500).strip()
    chunks = list(chunk_sections([Section("a.md", text, heading="H")], size=400, overlap=100))
    assert [c.chunk for c in chunks] == list(range(len(chunks)))
    assert all(c.text == text[c.start:c.end] and len(c.text) <= 400 for c in chunks)
    assert all(b.start == a.end - 100 for a, b in itertools.pairwise(chunks))
    assert chunks[-1].end == len(text) and chunks[0].provenance() == {
        "file": "a.md", "chunk": 0, "start": 0, "end": chunks[0].end, "page": None, "heading": "H"}
    assert chunks[1].key == "a.md#1"


def test_a_broken_pdf_and_a_pdf_without_text_are_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nnot really a pdf")
    with pytest.raises(UserError, match=r"broken.pdf: cannot be read as .pdf"):
        read_document(broken)
    from fpdf import FPDF

    scan = FPDF()
    scan.add_page()  # a page with no text, as a scan's pages are images
    scan.output(str(tmp_path / "scan.pdf"))
    with pytest.raises(UserError, match=r"scan.pdf: holds no text .a scanned PDF"):
        read_document(tmp_path / "scan.pdf")


def test_an_encrypted_pdf_is_named(tmp_path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_encryption(owner_password="owner", user_password="secret")
    pdf.add_page()
    pdf.set_font("helvetica", size=11)
    pdf.cell(0, 8, "hidden")
    pdf.output(str(tmp_path / "locked.pdf"))
    with pytest.raises(UserError, match=r"locked.pdf: the PDF is encrypted"):
        read_document(tmp_path / "locked.pdf")


def test_folders_and_seed_prompts(docs: dict[str, Path], tmp_path: Path) -> None:
    folder = docs["md"].parent
    assert [p.suffix for p in files_of([str(folder)], DOCUMENT_SUFFIXES)] == [".docx", ".html", ".md", ".pdf"]
    with pytest.raises(UserError, match=r"a .jsonl is not read here"):
        files_of([str(docs["prompts"])], DOCUMENT_SUFFIXES)
    assert [p.text for p in read_prompts(docs["prompts"])] == list(PROMPTS)
    csv = tmp_path / "seeds.csv"
    csv.write_text("question,topic\nWhat is a tram?,x\n", encoding="utf-8")
    assert [(p.text, p.key) for p in read_prompts(csv)] == [("What is a tram?", f"{csv}:2")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nothing": 1}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"bad.jsonl row 2: no prompt"):
        read_prompts(bad)
