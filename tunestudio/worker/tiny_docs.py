"""A few pages of documents to make data from (issue 43): the same made-up handbook as .md, .html, .pdf and .docx,
and seed prompts for the `answer` task. Written by a script, so the repository holds no binary and the readers
are tested on files that real tools made: fpdf2 writes the PDF (text you can extract, one topic a page),
python-docx the DOCX (Heading styles).

    python -m tunestudio.worker.tiny_docs DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["TOPICS", "write_docs"]

# (heading, paragraphs): a handbook of a made-up tram company, so no answer is in a model's pretraining.
TOPICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Tickets and fares", (
        "A single ride on the Cedar Valley Tram costs 2 crowns and is valid for 90 minutes from the moment it is "
        "stamped. Children under seven ride free when they travel with an adult.",
        "A monthly pass costs 38 crowns and covers every line, including the night line N4. Lost passes are "
        "replaced once a year for a fee of 5 crowns at the Harbour Square office.",
    )),
    ("Bicycles and luggage", (
        "Folding bicycles may be carried on every tram at any hour. Other bicycles are allowed only on lines 2 and "
        "7, outside the morning rush between 7:00 and 9:00, in the marked area of the last car.",
        "Luggage larger than 80 by 50 centimetres needs a luggage ticket of 1 crown. Pets in a closed basket "
        "travel free; dogs on a lead need a child's ticket and must wear a muzzle.",
    )),
    ("Lost property", (
        "Items found on a tram are taken to the lost property office at Harbour Square by the end of the driver's "
        "shift. The office keeps them for 60 days, after which they are given to the city's charity shop.",
        "To claim an item, bring an identity card and describe the item, the line and the approximate time. "
        "Keys and umbrellas are kept for 30 days only.",
    )),
    ("Accessibility", (
        "Every tram built after 2009 has a low floor and a ramp the driver lowers on request. Stops marked with a "
        "blue circle have raised platforms for step-free boarding.",
        "Guide dogs always travel free. A companion of a passenger with a disability card rides free on the same "
        "ticket, on every line and at every hour.",
    )),
)

PROMPTS = (
    "How long is a single tram ticket valid?",
    "Can I take my dog on the tram?",
    "Where do I collect something I left on a tram?",
    "Is there step-free access on the trams?",
)


def markdown() -> str:
    parts = ["# Cedar Valley Tram handbook", ""]
    for heading, paragraphs in TOPICS:
        parts += [f"## {heading}", "", *(p + "\n" for p in paragraphs)]
    return "\n".join(parts)


def html() -> str:
    body = "".join(f"<h2>{h}</h2>" + "".join(f"<p>{p}</p>" for p in ps) for h, ps in TOPICS)
    return (f"<!doctype html><html><head><title>Handbook</title><style>p {{ margin: 0 }}</style>"
            f"<script>var x = 1;</script></head><body><h1>Cedar Valley Tram handbook</h1>{body}</body></html>")


def write_pdf(path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    for heading, paragraphs in TOPICS:  # a page per topic: the reader's page numbers are checked
        pdf.add_page()
        pdf.set_font("helvetica", style="B", size=14)
        pdf.multi_cell(0, 8, heading, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("helvetica", size=11)
        for paragraph in paragraphs:
            pdf.multi_cell(0, 6, paragraph, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(3)
    pdf.output(str(path))


def write_docx(path: Path) -> None:
    import docx

    document = docx.Document()
    document.add_heading("Cedar Valley Tram handbook", level=1)
    for heading, paragraphs in TOPICS:
        document.add_heading(heading, level=2)
        for paragraph in paragraphs:
            document.add_paragraph(paragraph)
    document.save(str(path))


def write_docs(folder: Path) -> dict[str, Path]:
    """handbook.{md,html,pdf,docx} and prompts.jsonl in `folder`; the paths by suffix."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {s: folder / f"handbook.{s}" for s in ("md", "html", "pdf", "docx")}
    paths["md"].write_text(markdown(), encoding="utf-8")
    paths["html"].write_text(html(), encoding="utf-8")
    write_pdf(paths["pdf"])
    write_docx(paths["docx"])
    paths["prompts"] = folder / "prompts.jsonl"
    paths["prompts"].write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS), encoding="utf-8")
    return paths


if __name__ == "__main__":
    for written in write_docs(Path(sys.argv[1] if len(sys.argv) > 1 else "examples/docs")).values():
        print(written)
