"""Expert SFT trajectories over a real-text benchmark's train split (the stepwise-real world's real part).

`trajectories(name)` builds the benchmark of `real_docs` in a temporary folder, exactly as
`atom demo-world --real NAME` does (same passages, same index, so the same local urls and
snippets that a rollout with `--search local:.../index.sqlite --k 3` gets), and has
`RealExpert` solve every question of the **train** split; the test split is never read into
a trajectory. Rows are those whose answer matches a golden answer and was copied from an
observation.

`RealExpert` knows which passage holds the answer (the question's `support`, the builder's
knowledge) and only uses it to judge what the tools returned, never as text in a turn:

- its first query is the question's key terms; when the answer's passage is not in the
  results it rewrites the query (the question's rarest terms, then the terms the passage's
  title shares with the question) rather than repeat it;
- for a 2-hop question, when the results show the bridging passage instead, it takes the
  identifier that passage names (read from its snippet, or from the page when the snippet
  shows none) and searches for it;
- when the answer's passage is found but its snippet lacks the answer, it browses it;
- it quotes the sentence that states the answer, cut just after the answer, and answers with
  the span as written there (the quote's last words);
  when the results also hold a tempting sentence with another value of the answer's kind, it
  quotes that one first and names the question's words that only the answer's sentence has
  (`rival`: the reading the policy gets wrong on real pages).
"""

from __future__ import annotations

import random
import re
import tempfile
from pathlib import Path

from atomcli.demo import expert_kit as kit
from atomcli.env import search_local

MAX_SEARCHES = 4
# Names a passage can bridge through: C functions and constants, SQL functions.
IDENT_RE = re.compile(r"\b(?:sqlite3_\w+(?:\(\))?|SQLITE_[A-Z0-9_]+|[a-z_]+\(\))")


def trajectories(name: str, *, seed: int = 0, context=None, spec: str = "",
                 snippets: str = search_local.PAGE_ORDER) -> tuple[list[dict], int]:
    """(rows for the train questions the expert solved, how many it dropped).

    spec: search the index of a world that holds these passages among others (stepwise-real), so the
    observations are the ones its rollouts get; "" builds the benchmark's own index. snippets: the
    index's snippet order (search_local.SNIPPET_ORDERS)."""
    from atomcli.context import Context
    from atomcli.demo import real_docs

    ctx = context or Context(quiet=True)
    corpus, questions = real_docs.load(name)
    train = [q for q in questions if q["split"] == "train"]  # never the test split
    def solve(search_spec: str) -> tuple[list[dict], int]:
        return kit.expert_trajectories(search_spec, ctx, lambda tools: RealExpert(tools, corpus, seed), train,
                                         lambda q: q["golden_answers"], snippets=snippets)

    if spec:
        return solve(spec)
    with tempfile.TemporaryDirectory(prefix="atom-real-sft-") as d:
        out = Path(d) / name
        real_docs.build(name, out)
        return solve("local:" + str(out / "index.sqlite"))


class RealExpert:
    """Answers real-benchmark questions with the real tools (see the module docstring)."""

    def __init__(self, toolbox, corpus: list[dict], seed: int):
        self.tb, self.seed = toolbox, seed
        self.docs = {d["id"]: d["title"] + "\n" + d["contents"] for d in corpus}
        self.titles = {d["id"]: d["title"] for d in corpus}
        self.df = _document_frequency(corpus)

    def solve(self, q: dict) -> dict | None:
        """The trajectory row, or None when the tools did not lead to the answer."""
        from atomcli.demo.real_docs import FLASHRAG_FIELDS
        from atomcli.env.search_local import local_url
        found = self._answer_passage(q)
        if found is None:
            return None
        answer_id, gold = found
        bridge_id = next((s for s in q["support"] if s != answer_id), None) if q["hops"] == 2 else None
        rng = random.Random(f"real-expert:{self.seed}:{q['id']}")
        rec = kit.Recorder(self.tb, {k: q[k] for k in FLASHRAG_FIELDS}, f"{q['id']}/0")
        terms = kit.key_terms(q["question"])
        goal = "a page about " + " ".join(self._rarest(terms, 3))
        units = [("PLAN", kit.say(rng, "plan_start", goal=goal, terms=", ".join(terms)))]
        queries = self._queries(terms, answer_id, bridge_id)
        target, bridged = local_url(answer_id), False
        while queries and len(rec.queries) < MAX_SEARCHES:
            query = queries.pop(0)
            if rec.issued(query):
                continue
            units.append(("ACTION", kit.say(rng, "rewrite" if rec.queries else "search", query=query)))
            hits = kit.results(rec.search(units, query))
            units = []
            own = next((r for r in hits if r["url"] == target), None)
            if own is not None:
                return self._read(rec, rng, own, gold, terms, units)
            bridge = next((r for r in hits if bridge_id and r["url"] == local_url(bridge_id)), None)
            if bridge is not None and not bridged:
                ident, units = self._bridge(rec, rng, bridge, answer_id, q["question"])
                if ident:
                    bridged = True
                    queries = [f"{ident} {' '.join(self._rarest(terms, 2))}", ident] + queries
                    continue
            units.append(("REFLECTION", kit.say(rng, "miss", target='"' + " ".join(self._rarest(terms, 3)) + '"')))
        return None

    def _answer_passage(self, q: dict) -> tuple[str, str] | None:
        """(support passage that states a golden answer, that answer); None if none does as a whole word."""
        for s in q["support"]:
            for g in q["golden_answers"]:
                if kit.value_pattern(g).search(self.docs.get(s, "")):
                    return s, g
        return None

    def _rarest(self, terms: list[str], n: int) -> list[str]:
        """The `n` terms found in the fewest passages (the most specific), in question order."""
        keep = sorted(terms, key=lambda t: (self.df.get(t.lower(), 0), terms.index(t)))[:n]
        return [t for t in terms if t in keep]

    def _queries(self, terms: list[str], answer_id: str, bridge_id: str | None) -> list[str]:
        """The question's key terms, then rewrites: its rarest terms, the terms a target page's title shares."""
        out = [" ".join(terms), " ".join(self._rarest(terms, 3))]
        for doc in (answer_id, bridge_id):
            if doc:
                title = {w.lower() for w in kit.key_terms(self.titles[doc])}
                shared = [t for t in terms if t.lower() in title]
                if shared:
                    out.append(" ".join(shared + [t for t in self._rarest(terms, 2) if t not in shared]))
        return [x for i, x in enumerate(out) if x and x not in out[:i]]

    def _read(self, rec, rng, own: dict, gold: str, terms: list[str], units) -> dict | None:
        """The answer from the passage's snippet, or from the page when the snippet lacks it."""
        text = own["snippet"]
        if kit.copy_span(text, gold) is None:
            goal = "the value the question asks for"
            units += [("OBSERVATION", kit.say(rng, "snippet_short", target=own["title"], goal=goal)),
                      ("ACTION", kit.say(rng, "browse", goal=goal, url=own["url"]))]
            text = rec.browse(units, own["url"], " ".join(terms))
            units = []
        span, said = kit.copy_span(text, gold), kit.quote(text, gold, terms, end_at_value=True)
        if span is None or said is None:
            return None
        contrast = rival(rec.seen[-1], gold, said, terms)
        if contrast is not None:  # a tempting sentence with another value of the answer's kind
            other, cue = contrast
            units = [("OBSERVATION", kit.say(rng, "rival", rival=other, quote=said)),
                     ("REFLECTION", kit.say(rng, "pick", cue=cue, which="second", answer=span))]
        else:
            units = [("OBSERVATION", kit.say(rng, "found", quote=said))]
            if rng.random() < 0.4 and len(own["title"]) <= 80:  # a long title would overrun the turn's token budget
                units.append(("VERIFICATION", kit.say(rng, "verify", target=own["title"])))
            units.append(("REFLECTION", kit.say(rng, "done", answer=span)))
        return rec.finish(units, span)

    def _bridge(self, rec, rng, bridge: dict, answer_id: str, question: str) -> tuple[str | None, list]:
        """The identifier the bridging passage names that leads on (snippet first, else its page)."""
        def pick(text: str) -> str | None:
            names = [m.group(0) for m in IDENT_RE.finditer(text)
                     if m.group(0).lower().rstrip("()") not in question.lower()
                     and m.group(0).rstrip("()").lower() in self.docs[answer_id].lower()]
            return names[0] if names else None
        text, units = bridge["snippet"], []
        if pick(text) is None:
            goal = "the name it refers to"
            units = [("OBSERVATION", kit.say(rng, "snippet_short", target=bridge["title"], goal=goal)),
                     ("ACTION", kit.say(rng, "browse", goal=goal, url=bridge["url"]))]
            text = rec.browse(units, bridge["url"], " ".join(kit.key_terms(question)))
            units = []
        ident = pick(text)
        if ident is None:
            return None, units
        quote = kit.quote(text, ident) or ident
        units.append(("OBSERVATION", kit.say(rng, "found", quote=quote)))
        units.append(("PLAN", kit.say(rng, "plan_next", goal=f"what {ident} says")))
        return ident, units


# The kinds of answer a rival sentence can offer instead: (the answer is one, a value of that kind in a sentence).
_KINDS = (
    (re.compile(r"\d+"), re.compile(r"(?<![\w.-])\d+(?![\w-]|\.\d)")),                       # a count, size, code
    (re.compile(r"\d+(?:\.\d+)+"), re.compile(r"(?<![\w.])\d+(?:\.\d+)+(?!\w|\.\d)")),        # a version
    (re.compile(r"[A-Za-z]\w*_\w*(?:\(\))?|[A-Z][A-Z0-9]+"), re.compile(r"\b(?:[A-Za-z]\w*_\w*|[A-Z][A-Z0-9]+)\b")),
)
RIVAL_WORDS = 16  # a rival is quoted shorter than the answer's sentence: both must fit one turn's 192 tokens
PAIR_CHARS = 320  # both quotes at most (digits and identifiers are ~2.6 characters a token in SmolLM2's vocabulary)


def rival(obs: str, gold: str, said: str, terms: list[str]) -> tuple[str, str] | None:
    """(a sentence the reader could take instead, the question's words that only the answer's quote has).

    Why: on real pages the policy answers from the sentence that shares most words with the question,
    and a page states several values of one kind ("the default ... is 2000", "as large as 32767");
    the question's other words decide which. The rival is the observation's sentence with the most
    key terms that states a value of the answer's kind but not the answer; None when there is none,
    or when no key term of the question is in the answer's quote and not in the rival."""
    kind = next((found for whole, found in _KINDS if whole.fullmatch(gold)), None)
    if kind is None:
        return None
    hits = kit.results(obs)
    pool = [s for h in hits for s in kit.sentences(h["snippet"])] if hits else kit.sentences(obs)
    gold_pat, best, best_score = kit.value_pattern(gold), None, 0
    for sent in pool:
        value = kind.search(sent)
        if (value is None or gold_pat.search(sent) or sent.rstrip(".") in said or said in sent
                or '"' in sent or "://" in sent):  # a quote in quotes, or a url, is not a sentence to read
            continue
        score = kit.term_hits(sent, terms)
        if score > best_score:
            best, best_score = kit.quote(sent, value.group(0), terms, RIVAL_WORDS, end_at_value=True), score
    if best is None:
        return None
    cue = [t for t in terms if kit.term_hits(said, [t]) and not kit.term_hits(best, [t])][:3]
    if not cue or len(best) + len(said) > PAIR_CHARS:
        return None
    return best, " ".join(cue)


def _document_frequency(corpus: list[dict]) -> dict[str, int]:
    from collections import Counter
    df: Counter = Counter()
    for d in corpus:
        df.update({t.lower() for t in kit.key_terms(d["title"] + " " + d["contents"])})
    return df

