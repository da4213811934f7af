"""The reference pages hold what the chapters use: every citation key is in the bibliography and
the glossary defines every term the chapters lean on (checked on the sources, without a build)."""

from __future__ import annotations

import re

import pytest

from course_tools import config, notebook
from tests.conftest import CHAPTERS, ROOT

BOOK = ROOT / "book"
# Terms every chapter's reader meets; each must be a glossary entry.
REQUIRED_TERMS = [
    "token", "byte-pair encoding", "embedding", "logit", "softmax", "cross-entropy", "attention",
    "causal mask", "KV cache", "grouped-query attention", "RoPE", "residual stream", "layer normalization",
    "RMSNorm", "pre-norm", "post-norm", "FLOP", "MFU", "activation checkpointing", "scaling law",
    "compute-optimal", "IsoFLOP profile", "mixture of experts", "expert", "router", "capacity factor",
    "load-balancing loss", "expert parallelism", "LoRA", "fine-tuning", "supervised fine-tuning",
    "reward model", "Bradley-Terry model", "RLHF", "KL penalty", "reward hacking", "DPO", "GRPO",
    "RL with verifiable rewards",
]


def _sources() -> dict[str, str]:
    """Every prose source of the book: its markdown pages and the chapters' markdown cells."""
    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in BOOK.glob("*.md")}
    for chapter in CHAPTERS:
        nb = notebook.read(config.solution_path(chapter))
        texts[chapter] = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return texts


def _glossary_terms() -> set[str]:
    text = (BOOK / "glossary.md").read_text(encoding="utf-8")
    body = text[text.index("```{glossary}"):]
    return {line.strip().lower() for line in body.splitlines()[1:] if line and not line[0].isspace()
            and not line.startswith("```")}


def test_every_citation_key_is_in_the_bibliography():
    bib = (BOOK / "references.bib").read_text(encoding="utf-8")
    keys = set(re.findall(r"^@\w+\{([^,]+),", bib, re.M))
    assert len(keys) > 40
    for source, text in _sources().items():
        for group in re.findall(r"\{cite:[a-z]+\}`([^`]+)`", text):
            missing = [k.strip() for k in group.split(",") if k.strip() not in keys]
            assert not missing or missing == ["Key"], f"{source}: unknown citation keys {missing}"


@pytest.mark.parametrize("term", REQUIRED_TERMS)
def test_the_glossary_defines_the_terms_the_chapters_use(term):
    assert term.lower() in _glossary_terms(), f"add '{term}' to book/glossary.md"


def test_every_term_reference_resolves_to_a_glossary_entry():
    terms = _glossary_terms()
    for source, text in _sources().items():
        for ref in re.findall(r"\{term\}`([^`]+)`", text):
            target = re.search(r"<([^>]+)>", ref)  # {term}`shown text <entry>`
            name = (target.group(1) if target else ref).strip().lower()
            assert name in terms, f"{source}: {{term}}`{ref}` has no glossary entry"
