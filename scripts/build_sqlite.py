"""Build the passages of the shipped real-text benchmark from Debian's `sqlite3-doc` package.

The SQLite documentation is in the public domain, so the extracted text is committed as
`atomcli/data/sqlite_docs/corpus.jsonl.gz`; this script is how that file was made, and
running it again on the same package gives the same bytes:

    cd /tmp && apt-get download sqlite3-doc && dpkg -x sqlite3-doc_*.deb pkg
    python scripts/build_sqlite.py /tmp/pkg/usr/share/doc/sqlite3
    python scripts/build_sqlite.py --check        # verify the questions, report BM25 top-3

(the shipped file was built from sqlite3-doc 3.40.1-2+deb12u2, Debian 12, with trafilatura
2.3.1; another trafilatura may cut text differently).

Pages: every C API page (`c3ref/*.html`, minus the three list pages), every SQL language
page (`lang_*.html`) and a fixed list of topic pages (pragmas, limits, datatypes,
compile-time options, result codes, file format, WAL, JSON, FTS5, ...): the pages the
questions are about, and several hundred more that are distractors of the same kind.

Passages: each page is cut into sections at its headings (<h1>-<h4>, the hidden per-pragma
headings of pragma.html, <dt> function headings, and paragraphs that are one bold phrase, as
in compile.html and limits.html); each section's HTML is turned into text by trafilatura;
a section shorter than MIN_WORDS is joined to the next one, and a longer one is cut at
paragraph (then sentence) boundaries into passages of about TARGET_WORDS and at most
MAX_WORDS words. A passage is {id: "sqlite/<page>#<n>", title: "<page title>: <section>",
contents}. No url: `atom search` then gives each passage a local url that browse_webpage
reads back from the index.

Questions (`atomcli/data/sqlite_docs/questions.jsonl`) are written by hand against these
passages, each with the ids of its support passages, so the passage ids are part of the
data: after changing this script, run `--check`, which re-verifies every question
(`atomcli.demo.real_docs.verify`), checks the split rule (`rule_split`) and reports how often plain
BM25 on the question text already surfaces the answer in its top 3 (a difficulty number).

Needs only the standard library and trafilatura (a dependency of atomcli); `--check` also
imports atomcli.
"""

from __future__ import annotations

import argparse
import gzip
import html as html_lib
import json
import re
import sys
import urllib.parse
from pathlib import Path

import trafilatura

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "atomcli" / "data" / "sqlite_docs"
MIN_WORDS, TARGET_WORDS, MAX_WORDS = 40, 150, 200

TOPIC_PAGES = """
pragma limits datatype3 datatypes compile rescode fileformat2 wal walformat foreignkeys autoinc
stricttables withoutrowid rowidtable json1 fts5 fts3 rtree cli uri tempfiles inmemorydb lockingv3
atomiccommit isolation howtocorrupt quirks faq versionnumbers gencol rowvalue windowfunctions
printf nulls loadext vtab threadsafe sharedcache mmap backup csv series carray dbstat zipfile sqlar
sqldiff partialindex expridx optoverview queryplanner eqp floatingpoint whentouse about different
serverless zeroconf selfcontained transactional features malloc pgszchng2016 security spellfix1
lang datatypes flextypegood deterministic appfunc errlog imposter shortnames intern-v-extern-blob
invalidutf footprint omitted fullsql amalgamation howtocompile limits cksumvfs dbpage dbhash
unionvtab swarmvtab vtablist schematab sqlanalyze recovery bindptr c_interface capi3 cintro
lang_keywords lts mostdeployed np1queryprob psow queryplanner-ng cpu uintcseq useovernet
stmt tclsqlite testing th3 undoredo unlock_notify vfs whyc asyncvfs debugging session sessionintro
""".split()
SKIP_C3REF = {"constlist", "funclist", "objlist"}

# Section boundaries in the raw HTML; group "h" is the heading's HTML.
_BOUNDARY = re.compile(
    r"<h[1-4]\b[^>]*>(?P<h1>.*?)</h[1-4]\s*>"                    # ordinary headings
    r"|<h\s+_id=[^>]*>(?P<h2>.*?)</h\s*>"                         # pragma.html's hidden headings
    r"|<dt>\s*(?:<p>)?\s*<b>(?P<h3>.*?)</b>\s*(?:</p>)?\s*</dt>"  # function lists (lang_*func)
    r"|<p>\s*<b>(?!PRAGMA\b)(?P<h4>[^<]{3,80}(?:<i>[^<]*</i>[^<]*)*)</b>\s*</p>",  # one bold phrase (compile, limits)
    re.S | re.I)
_TAG = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"[ \t\r\f\v\u00a0]+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")
_SECTION_NUMBER = re.compile(r"^\d+(\.\d+)*\.\s+")


def page_paths(src: Path) -> list[Path]:
    pages = sorted(p for p in (src / "c3ref").glob("*.html") if p.stem not in SKIP_C3REF)
    pages += sorted(src.glob("lang_*.html"))
    seen = {p.resolve() for p in pages}
    for name in TOPIC_PAGES:
        p = src / f"{name}.html"
        if p.exists() and p.resolve() not in seen:
            pages.append(p)
            seen.add(p.resolve())
    return pages


def clean_inline(fragment: str) -> str:
    """A heading's HTML -> plain text on one line, section number dropped."""
    fragment = re.sub(r"<br\s*/?>", ", ", fragment, flags=re.I)
    text = _SPACE.sub(" ", html_lib.unescape(_TAG.sub("", fragment))).strip()
    return _SECTION_NUMBER.sub("", text).strip()


def page_title(raw: str) -> str:
    m = re.search(r"<title>(.*?)</title>", raw, re.S | re.I)
    return clean_inline(m.group(1)) if m else ""


def body_of(raw: str, rel: str) -> str:
    """The part of the page that carries content: the site menu, scripts, diagrams and the
    table of contents are cut (c3ref pages: also the two headings above the body)."""
    menu = raw.find('id="searchmenu"')
    if menu >= 0:
        start = raw.find("<script", menu)  # the menu ends just before the page's first script
        raw = raw[start:] if start >= 0 else raw
    raw = re.sub(r"<script\b.*?</script\s*>|<style\b.*?</style\s*>|<svg\b.*?</svg\s*>", " ", raw, flags=re.S | re.I)
    raw = re.sub(r'<div class="fancy_toc">.*?<div id="toc_sub">(?:\s*<div class="fancy-toc\d">.*?</div>)*\s*</div>\s*</div>',
                 " ", raw, flags=re.S | re.I)
    if rel.startswith("c3ref/"):
        raw = re.sub(r"<div class=nosearch>.*?</div>", " ", raw, count=1, flags=re.S | re.I)
    return raw


def extract_text(fragment: str) -> str:
    doc = f"<html><body><article>{fragment}</article></body></html>"
    text = trafilatura.extract(doc, include_tables=True, include_comments=False, favor_recall=True,
                               deduplicate=False) or ""
    lines = (_SPACE.sub(" ", line).strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line)


def sections(body: str) -> list[tuple[str, str]]:
    """[(heading, text)] in page order; the text before the first heading has heading ''."""
    out, heading, start = [], "", 0
    for m in _BOUNDARY.finditer(body):
        out.append((heading, body[start:m.start()]))
        heading = clean_inline(next(g for g in m.group("h1", "h2", "h3", "h4") if g is not None))
        start = m.end()
    out.append((heading, body[start:]))
    result = []
    for head, frag in out:
        text = extract_text(frag) if _TAG.sub("", frag).strip() else ""
        if text or head:
            result.append((head, text))
    return result


def words(text: str) -> int:
    return len(text.split())


def chunk(units: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Cut [(heading, paragraph)] into pieces of about TARGET_WORDS words (never above MAX_WORDS)
    at paragraph bounds, then at sentence bounds inside a paragraph longer than a passage."""
    small = []
    for head, para in units:
        if words(para) <= MAX_WORDS:
            small.append((head, para))
            continue
        for sent in _SENTENCE.split(para):
            w = sent.split()
            while len(w) > MAX_WORDS:            # a sentence longer than a passage (a long code block)
                small.append((head, " ".join(w[:TARGET_WORDS])))
                w = w[TARGET_WORDS:]
            small.append((head, " ".join(w)))
    if sum(words(p) for _, p in small) <= MAX_WORDS:
        return [small]
    pieces, cur, n = [], [], 0
    for unit in small:
        k = words(unit[1])
        if cur and (n + k > MAX_WORDS or n >= TARGET_WORDS):
            pieces.append(cur)
            cur, n = [], 0
        cur.append(unit)
        n += k
    if cur:
        if pieces and n < MIN_WORDS and sum(words(p) for _, p in pieces[-1]) + n <= MAX_WORDS + MIN_WORDS:
            pieces[-1].extend(cur)
        else:
            pieces.append(cur)
    return pieces


def page_passages(path: Path, src: Path) -> list[dict]:
    rel = path.relative_to(src).as_posix()
    page = rel[:-len(".html")]
    raw = path.read_text(encoding="utf-8", errors="replace")
    title = page_title(raw)
    if page.startswith("c3ref/"):
        title = f"C API: {title}"
    groups, pending = [], []          # join short sections to the next one
    for head, text in sections(body_of(raw, rel)):
        pending.append((head if head != title else "", text))
        if sum(words(t) for _, t in pending) >= MIN_WORDS:
            groups.append(pending)
            pending = []
    if pending:
        if groups and sum(words(t) for _, t in pending) < MIN_WORDS // 2:
            groups[-1].extend(pending)
        else:
            groups.append(pending)
    out = []
    for group in groups:
        units = []
        for i, (head, text) in enumerate(group):
            if i and head and not text.startswith(head):  # several sections in one passage: keep the heading
                units.append((head, head))
            units.extend((head, para) for para in text.split("\n") if para.strip())
        for piece in chunk(units):
            contents = "\n".join(p for _, p in piece).strip()
            if words(contents) < 5:
                continue
            heads = list(dict.fromkeys(h for h, _ in piece if h))
            section = ", ".join(heads[:4]) + (", ..." if len(heads) > 4 else "")
            out.append({"id": f"sqlite/{page}#{len(out)}", "title": f"{title}: {section}" if section else title,
                        "contents": contents})
    return out


def build(src: Path) -> list[dict]:
    passages = []
    for path in page_paths(src):
        passages.extend(page_passages(path, src))
    return passages


def write_gz(rows: list[dict], path: Path) -> int:
    data = b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz:
        gz.write(data)
    return len(data)


# Questions sqlite_140-sqlite_599 are a training supplement (written against passages no test question answers
# from), so that the SFT sees real text to read in more than 84 trajectories; they are all train. Questions from
# sqlite_600 on are a test supplement (60 questions on pages no training question uses), so that a paired interval
# is narrower than on the first 55.
SUPPLEMENT_FROM = 140
TEST_SUPPLEMENT_FROM = 600


def split_of(position: int) -> str:
    """The split rule of the first 139 questions of questions.jsonl: within each hops stratum, in file
    order, the 2nd and 4th of every 5 questions are test (40%), the others train."""
    return "test" if position % 5 in (1, 3) else "train"


def rule_split(q: dict, position: int) -> str:
    """The split a question must have: `split_of` its position, train for the training supplement, test for
    the test supplement."""
    num = int(q["id"].rsplit("_", 1)[1])
    if num >= TEST_SUPPLEMENT_FROM:
        return "test"
    return "train" if num >= SUPPLEMENT_FROM else split_of(position)


def check(top_k: int = 3) -> int:
    """Verify the shipped questions against the shipped corpus and the split rule; print how
    often a golden answer is in BM25's top-k for the bare question (snippets, whole passages)."""
    sys.path.insert(0, str(REPO))
    import tempfile

    from atomcli.demo import real_docs
    from atomcli.env import search_local
    corpus, questions = real_docs.load("sqlite")
    problems = real_docs.verify(questions, corpus)
    seen = {1: 0, 2: 0}
    for q in questions:
        if q["hops"] in seen:
            if q["split"] != rule_split(q, seen[q["hops"]]):
                problems.append(f"{q['id']}: split {q['split']} breaks the split rule")
            seen[q["hops"]] += 1
    for p in problems:
        print("PROBLEM", p)
    stats = {}  # hops -> [questions, hit in snippets, hit in passages]
    with tempfile.TemporaryDirectory() as tmp:
        cpath = Path(tmp) / "corpus.jsonl"
        cpath.write_text("".join(json.dumps(d) + "\n" for d in corpus))
        search_local.build_index(str(cpath), str(Path(tmp) / "index.sqlite"))
        index = search_local.LocalIndex(str(Path(tmp) / "index.sqlite"))
        for q in questions:
            res = index.search(q["question"], top_k)
            snippets = " ".join(r["title"] + " " + r["snippet"] for r in res)
            passages = " ".join(index.read_local(r["url"]) or "" for r in res)
            ids = {urllib.parse.unquote(r["url"][len(search_local.LOCAL_PREFIX):]) for r in res}
            row = stats.setdefault(q["hops"], [0, 0, 0, 0])
            row[0] += 1
            row[1] += any(real_docs.occurs(g, snippets) for g in q["golden_answers"])
            row[2] += any(real_docs.occurs(g, passages) for g in q["golden_answers"])
            row[3] += q["support"][-1] in ids  # the passage that holds the answer (last support)
        index.close()
    n = sum(r[0] for r in stats.values())
    print(f"{n} questions, {len(problems)} problems")
    for name, col in (("gold in the snippets", 1), ("gold in the passages", 2), ("answer passage", 3)):
        hit = sum(r[col] for r in stats.values())
        print(f"{name} of BM25's top {top_k} (question as query): {hit}/{n} = {hit / n:.2f}; "
              + ", ".join(f"{h}-hop {r[col]}/{r[0]} = {r[col] / r[0]:.2f}" for h, r in sorted(stats.items())))
    return 1 if problems else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", nargs="?", help="the extracted documentation folder (…/usr/share/doc/sqlite3)")
    ap.add_argument("--out", default=str(DATA / "corpus.jsonl.gz"))
    ap.add_argument("--check", action="store_true", help="verify the questions and report retrieval difficulty")
    args = ap.parse_args(argv)
    if args.check:
        return check()
    if not args.src:
        ap.error("give the documentation folder, or --check")
    src = Path(args.src)
    passages = build(src)
    n = write_gz(passages, Path(args.out))
    pages = len({p["id"].split("#")[0] for p in passages})
    print(f"wrote {args.out}: {len(passages)} passages from {pages} pages, {n:,} bytes uncompressed, "
          f"{Path(args.out).stat().st_size:,} gzipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
