"""The research style of the demo world: `atom demo-world --style research` (issue 20).

The classic world (`world.py`, the default, unchanged byte for byte) teaches the agent format;
an agent trained on it alone copies the expert's template and does not research. This style
writes the same files (`world.FILES`), with a world that needs reading and an expert that
researches:

- the same entities and relations as the classic world (`world.build_world`), plus namesakes:
  about a fifth of the people, organisations and works get a second entity of a similar name
  (the same surname, or the same first word with another suffix), with facts of its own;
- longer articles (~12-16 sentences): the name appears in the opening sentences only, the
  facts come after several unrelated sentences and are written with pronouns, so a 48-word
  search snippet often shows the entity without the fact and the page must be read; each
  relation has several phrasings ("studied under X", "her mentor was X", "a pupil of X");
  pages of entities with a namesake warn about it, so snippets also merely mention namesakes;
- `ResearchExpert`: builds its queries from the question's own words, rewrites a query that
  did not find the subject's page (some first queries use part of the name only, as a person
  might, and namesakes push the page out of the top results), browses when the snippet stops
  before the fact, quotes the sentence that states it, and answers with that span as soon as
  the last fact is in hand. It knows the question's chain (the builder's knowledge), but only
  accepts a fact that an observation shows.

The SFT set mixes these trajectories with those of `real_sft` over the real benchmark's train
split (never its test split). Questions are generated from this world as `world.py` does (so
they differ from the classic world's).

The RL steps see real text too: with a real benchmark (`real`, the default), the world's corpus
and index also hold that benchmark's passages, and `train.jsonl` ends with its train split
(FlashRAG rows, `data_source` sqlite_1hop / sqlite_2hop, which the hops curriculum reads), so one
search backend serves both kinds of question and run-all's steps draw both. The test split stays
the demo world's own questions (the real test split is the transfer eval, over the real index alone).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from atomcli.demo import research_expert as rx
from atomcli.demo import world as dw

NAMESAKE_SHARE = 0.2
FILLERS_BEFORE = (3, 5)   # unrelated sentences before the first fact: past a 48-word snippet
FILLERS_AFTER = (1, 3)

# relation -> (sentence, evidence span) phrasings; {P} She/He/It, {p} lower, {Poss} Her/His/Its,
# {o} her/him/it, {V} the value; the span is the shortest part of the sentence that states the fact.
PHRASINGS = {
    "birthplace": (("{P} was born in {V}.", "born in {V}"), ("{P} is a native of {V}.", "native of {V}"),
                   ("{Poss} birthplace was the city of {V}.", "birthplace was the city of {V}"),
                   ("{V} is the city where {p} was born.", "{V} is the city where {p} was born")),
    "birth_year": (("{P} was born in {V}.", "born in {V}"), ("{Poss} year of birth was {V}.", "year of birth was {V}"),
                   ("{P} came into the world in {V}.", "came into the world in {V}")),
    "mentor": (("{P} studied under {V}.", "studied under {V}"), ("{Poss} mentor was {V}.", "mentor was {V}"),
               ("{P} was a pupil of {V}.", "pupil of {V}"), ("{V} taught {o} for several years.", "{V} taught {o}")),
    "alma_mater": (("{P} attended {V}.", "attended {V}"), ("{P} was educated at {V}.", "educated at {V}"),
                   ("{P} graduated from {V}.", "graduated from {V}")),
    "country": (("The city lies in {V}.", "lies in {V}"), ("It is a city of {V}.", "city of {V}"),
                ("The town belongs to {V}.", "belongs to {V}")),
    "city_founded": (("It was founded in {V}.", "founded in {V}"), ("Its founding dates to {V}.", "founding dates to {V}"),
                     ("The town received its charter in {V}.", "charter in {V}")),
    "capital": (("Its capital is {V}.", "capital is {V}"), ("The seat of government is {V}.", "seat of government is {V}"),
                ("{V} serves as its capital.", "{V} serves as its capital")),
    "founder": (("It was founded by {V}.", "founded by {V}"), ("Its founder was {V}.", "founder was {V}"),
                ("{V} is credited as its founder.", "{V} is credited as its founder")),
    "hq": (("It is based in {V}.", "based in {V}"), ("Its headquarters are in {V}.", "headquarters are in {V}"),
           ("It has its offices in {V}.", "offices in {V}")),
    "org_founded": (("It was established in {V}.", "established in {V}"),
                    ("It opened its doors in {V}.", "opened its doors in {V}"),
                    ("Its founding year was {V}.", "founding year was {V}")),
    "creator": (("It is a {kind} by {V}.", "{kind} by {V}"), ("{V} {active} it.", "{V} {active} it"),
                ("Its {maker} was {V}.", "{maker} was {V}")),
    "publisher": (("It was {pub} by {V}.", "{pub} by {V}"), ("{V} {pub} it.", "{V} {pub} it"),
                  ("The {org} {V} {pub} it.", "{org} {V} {pub} it")),
    "work_year": (("It was {made} in {V}.", "{made} in {V}"), ("The {kind} dates from {V}.", "dates from {V}"),
                  ("It was completed in {V}.", "completed in {V}")),
}
# Sentences that hold no asked fact; {who} a person's name, {where} a city's, {n} a year.
FILLERS = (
    "{P} corresponded for years with {who}.", "A letter from {who} mentions {o} in passing.",
    "Critics have compared {o} to the work of {who}.", "An exhibition about {o} toured {where} in {n}.",
    "Records from {n} describe {o} briefly.", "Little is known about {o} before {n}.",
    "A biography by {who} appeared in {n}.", "Its archive holds papers donated by {who}.",
    "A fire in {n} destroyed part of the records.", "Visitors often confuse it with places near {where}.",
    "The name is said to come from an old word for a river crossing.",
    "Several accounts disagree on the early years.", "A local society publishes notes on its history.",
    "Guidebooks from {n} mention {o} alongside {who}.", "Much of what survives comes from later accounts.",
)


# --- the world ----------------------------------------------------------------------------------

def build(seed: int, articles: int) -> dw.World:
    """The classic world's entities, plus namesakes (a fifth of people, organisations and works)."""
    world = dw.build_world(seed, articles)
    rng = random.Random(f"research-namesakes:{seed}")
    namer = dw.Namer(rng)
    namer.used = {dw._STEM.sub("", w.lower()) for e in world.entities.values() for w in e.name.split()}
    titles = {e.name for e in world.entities.values()}
    for kind, make in (("person", _person_namesake), ("org", _org_namesake), ("work", _work_namesake)):
        for eid in list(world.by_kind[kind]):
            if rng.random() < NAMESAKE_SHARE:
                name = make(world.get(eid), world, rng, namer)
                if name not in titles:
                    titles.add(name)
                    twin = _add(world, kind, name, dict(world.get(eid).info))
                    _facts(twin, world, rng)
                    world.get(eid).info["namesake"], twin.info["namesake"] = twin.id, eid
    return world


def _add(world: dw.World, kind: str, name: str, info: dict) -> dw.Entity:
    info.pop("namesake", None)
    e = dw.Entity(f"{kind}-{len(world.by_kind[kind]):04d}", kind, name, info=info)
    world.entities[e.id] = e
    world.by_kind[kind].append(e.id)
    return e


def _person_namesake(e, world, rng, namer) -> str:
    return f"{namer.word()} {e.name.split()[-1]}"


def _org_namesake(e, world, rng, namer) -> str:
    others = [s for s in dw.ORG_KINDS[e.info["category"]][1] if not e.name.endswith(s)]
    return f"{e.name.split()[0]} {rng.choice(others)}"


def _work_namesake(e, world, rng, namer) -> str:
    others = [t for t in dw.WORK_KINDS[e.info["work_kind"]].titles if not e.name.endswith(t)]
    return f"{e.name.split()[0]} {rng.choice(others)}"


def _facts(e: dw.Entity, w: dw.World, rng: random.Random) -> None:
    """Facts for a namesake, drawn as build_world draws them (its own, not its twin's)."""
    f, people = e.facts, w.by_kind["person"]
    if e.kind == "person":
        e.info["pronoun"] = rng.choice(("She", "He"))
        f["birth_year"], f["birthplace"] = rng.randint(1760, 1960), rng.choice(w.by_kind["city"])
        older = [p for p in people if "birth_year" in w.get(p).facts and w.get(p).facts["birth_year"] <= f["birth_year"] - 15]
        if older:
            f["mentor"] = rng.choice(older)
        f["alma_mater"] = rng.choice([o for o in w.by_kind["org"] if w.get(o).info["category"] == "university"])
    elif e.kind == "org":
        f["hq"], f["founder"] = rng.choice(w.by_kind["city"]), rng.choice(people)
        f["org_founded"] = min(2000, w.get(f["founder"]).facts["birth_year"] + rng.randint(22, 60))
    else:
        wk = dw.WORK_KINDS[e.info["work_kind"]]
        f["creator"] = rng.choice([p for p in people if w.get(p).info["occupation"] == wk.occupation])
        f["work_year"] = min(2020, w.get(f["creator"]).facts["birth_year"] + rng.randint(20, 60))
        pool = [o for o in w.by_kind["org"] if w.get(o).info["category"] == wk.category]
        existing = [o for o in pool if w.get(o).facts["org_founded"] <= f["work_year"]]
        if not existing:
            existing = [min(pool, key=lambda o: w.get(o).facts["org_founded"])]
            f["work_year"] = w.get(existing[0]).facts["org_founded"] + rng.randint(0, 10)
        f["publisher"] = rng.choice(existing)


# --- articles ----------------------------------------------------------------------------------

def label(world: dw.World, value) -> str:
    """How a fact's value is written: an entity's name, or a year."""
    return str(value) if isinstance(value, int) else world.get(value).name


def _pronouns(e: dw.Entity) -> dict:
    if e.kind == "person":
        she = e.info["pronoun"] == "She"
        return {"P": e.info["pronoun"], "p": e.info["pronoun"].lower(), "Poss": "Her" if she else "His",
                "o": "her" if she else "him"}
    return {"P": "It", "p": "it", "Poss": "Its", "o": "it"}


def _intro(e: dw.Entity, w: dw.World) -> str:
    if e.kind == "person":
        country = w.get(w.get(e.facts["birthplace"]).facts["country"]).name
        return f"{e.name} is {dw._a(e.info['occupation'])} from {country}."
    if e.kind == "org":
        return f"{e.name} is {dw._a(dw.ORG_KINDS[e.info['category']][0])}."
    if e.kind == "work":
        return f"{e.name} is {dw._a(e.info['work_kind'])}."
    return f"{e.name} is {'a country' if e.kind == 'country' else 'a city'}."


def _article(e: dw.Entity, w: dw.World, rng: random.Random) -> tuple[dict, dict]:
    """The article of `e` and the evidence span of each of its facts {relation: span}."""
    words = {**_pronouns(e), **dw.kind_words(e)}
    facts, spans = [], {}
    for rel, value in e.facts.items():
        sentence, span = rng.choice(PHRASINGS[rel])
        fields = {**words, "V": label(w, value)}
        facts.append(sentence.format(**fields))
        spans[rel] = span.format(**fields)
    rng.shuffle(facts)
    fill = [s.format(who=w.get(rng.choice(w.by_kind["person"])).name, where=w.get(rng.choice(w.by_kind["city"])).name,
                     n=rng.randint(1800, 2010), **words)
            for s in rng.sample(FILLERS, FILLERS_BEFORE[1] + FILLERS_AFTER[1])]
    before, after = rng.randint(*FILLERS_BEFORE), rng.randint(*FILLERS_AFTER)
    head = [_intro(e, w)]
    if "namesake" in e.info:
        head.append(f"{e.name} should not be confused with {w.get(e.info['namesake']).name}.")
    body = head + fill[:before] + facts[:2] + fill[before:before + 1] + facts[2:] + fill[before + 1:before + 1 + after]
    return {"id": e.id, "title": e.name, "contents": " ".join(body)}, spans


def render(world: dw.World, seed: int) -> tuple[list[dict], dict]:
    """Articles in the classic order, and {(entity id, relation): evidence span}."""
    rng = random.Random(f"research-articles:{seed}")
    docs, spans = [], {}
    for kind in ("country", "city", "person", "org", "work"):
        for eid in world.by_kind[kind]:
            doc, s = _article(world.get(eid), world, rng)
            docs.append(doc)
            spans.update({(eid, rel): span for rel, span in s.items()})
    return docs, spans


# --- the expert -----------------------------------------------------------------------------------

def _template_words(rel: dw.Relation, words: dict) -> set[str]:
    text = " ".join(rel.noun + rel.ask + rel.queries).format(s="", **{k: words.get(k, "") for k in
                                                                          ("maker", "made", "active", "org", "pub", "kind")})
    return {t.lower() for t in rx.key_terms(text)}


def _shows(text: str, span: str) -> bool:
    """`span` is in `text` whole (a name cut by the snippet's end does not count)."""
    return re.search(re.escape(span) + r"(?!\w)", " ".join(text.split())) is not None


class ResearchExpert:
    """Solves questions of the research world with the real tools, one fact at a time."""

    def __init__(self, toolbox, world: dw.World, spans: dict, seed: int):
        self.tb, self.world, self.spans, self.seed = toolbox, world, spans, seed

    def solve(self, q: dw.Question) -> dict | None:
        """The trajectory row, or None when the tools did not show a fact (the question is dropped)."""
        rng = random.Random(f"research-expert:{self.seed}:{q.id}")
        rec = rx.Recorder(self.tb, q.row(), f"{q.id}/0")
        terms = rx.key_terms(q.question)
        units = [("PLAN", rx.say(rng, "plan_start", goal=self._goal(q, 0), terms=", ".join(terms)))]
        for i in range(len(q.chain)):
            units = self._hop(rec, rng, q, i, terms, units)
            if units is None:
                return None
            if i + 1 < len(q.chain):
                units.append(("PLAN", rx.say(rng, "plan_next", goal=self._goal(q, i + 1))))
        answer = label(self.world, q.path[-1])
        units.append(("REFLECTION", rx.say(rng, "done", answer=answer)))
        return rec.finish(units, answer)

    def _goal(self, q: dw.Question, i: int) -> str:
        subject = self.world.get(q.path[i])
        return dw.REL[q.chain[i]].goal.format(s=subject.name, **dw.kind_words(subject))

    def _queries(self, q: dw.Question, i: int, terms: list[str], rng: random.Random) -> list[str]:
        """Queries to try in order: the question's words for this fact around the subject's name, then rewrites."""
        subject = self.world.get(q.path[i])
        rel = dw.REL[q.chain[i]]
        cues = [t for t in terms if t.lower() in _template_words(rel, dw.kind_words(subject))
                and t.lower() not in subject.name.lower()] or rx.key_terms(rel.goal.format(s="", **dw.kind_words(subject)))
        cue = " ".join(cues)
        full = rng.choice((f"{subject.name} {cue}", f"{cue} {subject.name}"))
        short = subject.name.split()[-1 if subject.kind == "person" else 0]
        kind_noun = subject.info.get("occupation") or subject.info.get("work_kind") or subject.kind
        tries = [full, subject.name, f"{subject.name} {kind_noun}"]
        # Thin first tries, as people write them, that the expert then rewrites when they miss: part of
        # the name (namesakes crowd it out), or the question's words instead of the name just found.
        if i == 0 and " " in subject.name and rng.random() < 0.4:
            tries.insert(0, f"{short} {cue}")
        elif i > 0 and rng.random() < 0.3:
            tries.insert(0, " ".join(terms))
        return tries

    def _hop(self, rec: rx.Recorder, rng, q: dw.Question, i: int, terms: list[str], units):
        """Search (rewriting as needed), browse when the snippet falls short; the next turn's thoughts, or None."""
        subject = self.world.get(q.path[i])
        span, goal = self.spans[(subject.id, q.chain[i])], self._goal(q, i)
        first = True
        for query in (x for x in self._queries(q, i, terms, rng) if not rec.issued(x)):
            units.append(("ACTION", rx.say(rng, "search" if first else "rewrite", query=query)))
            obs = rec.search(units, query)
            first, units = False, []
            hits = rx.results(obs)
            own = next((r for r in hits if r["title"] == subject.name), None)
            twins = [r["title"] for r in hits if r["title"] != subject.name
                     and set(r["title"].split()) & set(subject.name.split())]
            if twins:
                units.append(("RISK_ANALYSIS", rx.say(rng, "namesake", other=twins[0], target=subject.name)))
            if own is None:
                units.append(("REFLECTION", rx.say(rng, "miss", target=subject.name)))
                continue
            if not _shows(own["snippet"], span):
                units += [("OBSERVATION", rx.say(rng, "snippet_short", target=subject.name, goal=goal)),
                          ("ACTION", rx.say(rng, "browse", goal=goal, url=own["url"]))]
                page = rec.browse(units, own["url"], goal)
                units = []
                if not _shows(page, span):
                    return None
            units = [("OBSERVATION", rx.say(rng, "found", quote=span))]
            if rng.random() < 0.4:
                units.append(("VERIFICATION", rx.say(rng, "verify", target=subject.name)))
            return units
        return None


# --- the folder -------------------------------------------------------------------------------------

def main(out: str, *, seed: int, articles: int, train: int, test: int, sft: int, real: str = "sqlite",
         context=None) -> dict:
    """Write the research-style world into `out` (replaced atomically); return a summary."""
    from atomcli import safety, tableio
    from atomcli.context import Context
    from atomcli.demo import real_docs, real_sft
    from atomcli.env import search_local

    ctx = context or Context(quiet=True)
    dw.check_sizes(articles, train, test, sft)
    dest = Path(out)
    safety.check_output(dest, safety.DEMO_WORLD)
    world = build(seed, articles)
    train_q, test_q = dw.split_questions(dw.make_questions(world, train + test, seed), test)
    docs, spans = render(world, seed)
    real_docs_, real_train = real_docs.train_part(real)
    with tableio.atomic_dir(dest) as tmp:
        (tmp / "corpus.jsonl").write_bytes(dw._jsonl(docs + real_docs_))
        (tmp / "train.jsonl").write_bytes(dw._jsonl([q.row() for q in train_q] + real_train))
        (tmp / "test.jsonl").write_bytes(dw._jsonl([q.row() for q in test_q]))
        index = str(tmp / "index.sqlite")
        search_local.build_index(str(tmp / "corpus.jsonl"), index)
        demo_rows, dropped = dw.expert_trajectories("local:" + index, ctx,
                                                    lambda tools: ResearchExpert(tools, world, spans, seed),
                                                    train_q, lambda q: q.golden_answers, limit=sft)
        real_rows, real_dropped = real_sft.trajectories(real, seed=seed, context=ctx) if real else ([], 0)
        rows = demo_rows + real_rows
        random.Random(f"research-mix:{seed}").shuffle(rows)  # SFT batches see both kinds of question
        config = {"seed": seed, "articles": articles, "train": train, "test": test, "sft": sft, "k": dw.SFT_K,
                  "date": dw.SYSTEM_DATE, "style": "research", "real": real or None, "real_sft": len(real_rows),
                  "real_train": len(real_train), "real_passages": len(real_docs_)}
        (tmp / "sft.parquet").write_bytes(tableio.table_bytes(dw.sft_table(rows, config), "parquet"))
    ctx.log(f"[green]wrote[/] {out}: research style, {len(docs):,} articles "
            f"({sum('namesake' in e.info for e in world.entities.values())} with a namesake), "
            f"+ {len(real_docs_):,} real ({real}) passages, {len(train_q)} + {len(real_train)} real train / "
            f"{len(test_q)} test questions, {len(demo_rows)} demo + {len(real_rows)} "
            f"real-text SFT trajectories ({dropped} + {real_dropped} expert failures dropped)")
    return {"articles": len(docs), "train": len(train_q), "test": len(test_q), "sft": len(rows),
            "sft_demo": len(demo_rows), "sft_real": len(real_rows), "dropped": dropped + real_dropped,
            "real_train": len(real_train), "real_passages": len(real_docs_), "style": "research"}
