"""The embedded demo research world (DESIGN.md §7): `atom demo-world --out DIR --seed S`.

A seeded generator of a fictional encyclopedia and of questions that only searching it can
answer. Everything is invented (names built from syllables, dates, relations), so a
pretrained model cannot answer from memory; the same seed gives the same bytes in every file.

The world: countries, cities, people, organisations (publishing houses, orchestras,
galleries, universities) and works (novels, poetry collections, symphonies, paintings),
linked by functional relations (a person's birthplace and mentor, an organisation's founder
and home city, a work's creator and publisher, ...). Questions follow a chain of 1-4
relations from a named anchor: "Where was the founder of the publishing house that
published Quessarine Chronicles born?" is 3 hops; "In what year was Orlenic Press founded?"
is 1. Every relation is a function, so every question has one answer.

DIR receives:
- `corpus.jsonl`: one article per entity {id, title, contents};
- `train.jsonl`, `test.jsonl`: FlashRAG questions {id, question, golden_answers, data_source
  = demo_1hop..demo_4hop}; no question text is in both;
- `index.sqlite`: the corpus indexed by `atom index` (search SPEC `local:DIR/index.sqlite`);
- `sft.parquet`: trajectories of a scripted expert that really uses the tools (one hop per
  turn) on train questions only, in the atomic-thought agent format, for `atom sft`.

The expert searches through `atomcli.env.tools.ToolBox` with k=3 results per query, so its
observations are byte-identical to what a rollout with `--search local:DIR/index.sqlite
--k 3` sees; with another k the SFT observations are shorter than the rollout's. It reads
the fact it needs from the result whose title is the entity it is looking up (regular
expressions over the article's sentences), opens the page with `browse_webpage` when the
snippet stops short of the fact, and searches the bare name when the article is not among
the results. Only trajectories whose answer matches a golden answer become SFT rows.

`main(..., style="research")` (`atom demo-world --style research`) writes instead the world
and SFT mix of `research_world.py` (namesakes, pages that must be read, an expert that
researches, plus real-text train trajectories); this module's world and expert, the default
"classic" style, stay byte-for-byte what they were so that earlier measurements reproduce.

`main(..., style="stepwise")` writes this very world (corpus, questions, index: the same bytes
as classic) with another SFT set: the expert's plans name no hop count ("This is a 3-hop question"
asks a small policy to count the relations in the question before it has seen anything, and the
learning study found the SFT policy's count independent of the question, bench/LEARNING.md
session 16). Instead, after each fact it rewrites the question with the fact in place ("The
question is now: In what year was Rourvre Zetox born?") or says that the fact answers it, so the
decision to search again or to answer is read off the latest form of the question in the context.

`main(..., style="stepwise-real")` is the stepwise world plus the train part of the real benchmark
REAL_MIX (issue 20): its passages join the corpus and index, its train questions follow the demo's
in train.jsonl (so run-all's steps draw both under a shuffled curriculum: shuffle, hops, balanced),
and `real_sft`'s expert trajectories over them, searched in this world's own index, are shuffled
into the SFT set. Its test split is never read: it stays the transfer benchmark. The shared index
changes the demo questions' results too (the real passages shift BM25's statistics and a few rank
among them): with seed 0, 148 of the 200 demo SFT trajectories differ from stepwise's. Its demo expert
observes each fact by quoting the tool output's sentence ("Found it: \"Vroumgrou is a city in
Skagromia\"."), as the real-text expert does, so both kinds of row teach one way to read.

`serve(corpus)` serves every article as a small HTML page on a loopback port, so browsing
over real HTTP can be exercised in tests and demos.
"""

from __future__ import annotations

import html
import json
import random
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from atomcli import __version__
from atomcli.env import search_local
from atomcli.errors import InputError, unknown_choice

SFT_K = 3              # search results per query for the expert (see the module docstring)
SYSTEM_DATE = "2026-01-01"
HOP_WEIGHTS = (0.3, 0.3, 0.25, 0.15)  # share of 1..4-hop questions
MIN_ARTICLES = 100
FILES = ("corpus.jsonl", "train.jsonl", "test.jsonl", "index.sqlite", "sft.parquet")
STYLES = ("classic", "research", "stepwise", "stepwise-real")  # research: research_world.py; stepwise: this
# world, the expert rewriting the question after each fact (opt-in; classic is the default); stepwise-real: the
# stepwise world plus the real benchmark's train part (REAL_MIX: passages, questions, expert trajectories)
REAL_MIX = "sqlite"

# --- names ---------------------------------------------------------------------------------------

ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
          "br", "dr", "gr", "kr", "th", "sk", "vr", "zh", "q")
VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ou", "y")
CODAS = ("n", "r", "l", "th", "m", "x", "rk", "v", "sk")
# Suffixes a Porter stemmer strips: two names differing only by one would search as one.
_STEM = re.compile(r"(?:ing|ed|es|s|er|e|y|ly|al|ic|ous|ive|ate|iti|ment|ness|ion|ism|ist|ant|ent)$")


class Namer:
    """Invented, distinctive words; no two share a stem, so each name is its own search key."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self, syllables: tuple[int, int] = (2, 2)) -> str:
        from atomcli.env.search_local import STOPWORDS
        while True:
            n = self.rng.choice(range(syllables[0], syllables[1] + 1))
            w = "".join(self.rng.choice(ONSETS) + self.rng.choice(VOWELS)
                        + (self.rng.choice(CODAS) if self.rng.random() < 0.35 else "") for _ in range(n))
            key = _STEM.sub("", w)
            if 4 <= len(w) <= 10 and key not in self.used and w not in STOPWORDS:
                self.used.add(key)
                return w.capitalize()


# --- the world ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkKind:
    occupation: str     # who makes it: novelist, composer, ...
    maker: str          # "the {maker} of X": author, composer, painter
    made: str           # "was {made} in 1903": written, composed, painted
    active: str         # "who {active} X?": wrote, composed, painted
    category: str       # the kind of organisation that publishes it (ORG_KINDS)
    pub: str            # "the orchestra that {pub} X": published, premiered, exhibited
    titles: tuple       # the common noun in its title


WORK_KINDS = {
    "novel": WorkKind("novelist", "author", "written", "wrote", "publisher", "published",
                      ("Chronicles", "Inheritance", "Crossing", "Harvest", "Letters", "Winter")),
    "poetry collection": WorkKind("poet", "author", "written", "wrote", "publisher", "published",
                                  ("Elegies", "Verses", "Odes", "Psalms", "Sonnets")),
    "symphony": WorkKind("composer", "composer", "composed", "composed", "orchestra", "premiered",
                         ("Symphony", "Nocturne", "Requiem", "Overture", "Suite")),
    "painting": WorkKind("painter", "painter", "painted", "painted", "gallery", "exhibited",
                         ("Triptych", "Portrait", "Landscape", "Panorama", "Study")),
}
ORG_KINDS = {  # category: (noun in text, name suffixes)
    "publisher": ("publishing house", ("Press", "Editions", "Books")),
    "orchestra": ("orchestra", ("Philharmonic", "Orchestra", "Ensemble")),
    "gallery": ("gallery", ("Gallery", "Art Museum", "Salon")),
    "university": ("university", ("University", "Academy", "Institute")),
}
OCCUPATIONS = ("novelist", "poet", "composer", "painter", "architect", "astronomer", "engineer",
               "philosopher", "cartographer")
COUNTRY_SUFFIX = ("ia", "and", "ora", "esh", "ovia")
COUNTRY_FORMS = ("Republic", "Kingdom", "Commonwealth", "Grand Duchy")
CITY_SUFFIX = ("", "", "", "holt", "mere", "vik", "stad", "gard")


@dataclass
class Entity:
    id: str
    kind: str       # country | city | person | org | work
    name: str
    facts: dict = field(default_factory=dict)   # relation -> entity id or int (a year)
    info: dict = field(default_factory=dict)    # descriptive: category, occupation, form, ...


@dataclass
class World:
    entities: dict[str, Entity]
    by_kind: dict[str, list[str]]

    def get(self, eid: str) -> Entity:
        return self.entities[eid]


def build_world(seed: int, articles: int) -> World:
    """Entities and their facts, about `articles` of them, all from `random.Random(seed)`."""
    rng = random.Random(f"demo-world:{seed}")
    namer = Namer(rng)
    n_country = max(4, articles // 200)
    n_city = max(8, articles * 13 // 100)
    n_org = max(8, articles * 17 // 100)
    n_work = max(8, articles * 25 // 100)
    n_person = max(16, articles - n_country - n_city - n_org - n_work)
    ents: dict[str, Entity] = {}
    by_kind: dict[str, list[str]] = {k: [] for k in ("country", "city", "person", "org", "work")}

    def add(kind: str, i: int, name: str, **info) -> Entity:
        e = Entity(f"{kind}-{i:04d}", kind, name, info=info)
        ents[e.id] = e
        by_kind[kind].append(e.id)
        return e

    for i in range(n_country):
        add("country", i, namer.word((1, 2)) + rng.choice(COUNTRY_SUFFIX), form=rng.choice(COUNTRY_FORMS))
    countries = by_kind["country"]
    for i in range(n_city):
        c = add("city", i, namer.word() + rng.choice(CITY_SUFFIX))
        # the first cities go one to each country so that every country has a capital
        c.facts["country"] = countries[i] if i < len(countries) else rng.choice(countries)
        c.facts["city_founded"] = rng.randint(820, 1790)
    for cid in countries:
        mine = [c for c in by_kind["city"] if ents[c].facts["country"] == cid]
        ents[cid].facts["capital"] = rng.choice(mine)
    cities = by_kind["city"]

    occupations = list(OCCUPATIONS)
    for i in range(n_person):
        occ = occupations[i] if i < len(occupations) else rng.choice(occupations)  # every creator kind exists
        p = add("person", i, f"{namer.word()} {namer.word()}", occupation=occ, pronoun=rng.choice(("She", "He")))
        p.facts["birth_year"] = rng.randint(1760, 1960)
        p.facts["birthplace"] = rng.choice(cities)
    people = by_kind["person"]
    by_year = sorted(people, key=lambda p: (ents[p].facts["birth_year"], p))
    for pid in people:
        older = [q for q in by_year if ents[q].facts["birth_year"] <= ents[pid].facts["birth_year"] - 15]
        if older and rng.random() < 0.75:
            ents[pid].facts["mentor"] = rng.choice(older[-200:])  # a teacher of a nearby generation

    categories = list(ORG_KINDS)
    for i in range(n_org):
        cat = categories[i % len(categories)]
        o = add("org", i, f"{namer.word()} {rng.choice(ORG_KINDS[cat][1])}", category=cat)
        o.facts["hq"] = rng.choice(cities)
        founder = rng.choice(people)
        o.facts["founder"] = founder
        o.facts["org_founded"] = min(2000, ents[founder].facts["birth_year"] + rng.randint(22, 60))
    orgs_of = {cat: [o for o in by_kind["org"] if ents[o].info["category"] == cat] for cat in categories}
    for pid in people:
        if rng.random() < 0.8:
            ents[pid].facts["alma_mater"] = rng.choice(orgs_of["university"])

    kinds = list(WORK_KINDS)
    creators = {k: [p for p in people if ents[p].info["occupation"] == WORK_KINDS[k].occupation] for k in kinds}
    for i in range(n_work):
        kind = kinds[i % len(kinds)]
        w = add("work", i, f"{namer.word()} {rng.choice(WORK_KINDS[kind].titles)}", work_kind=kind)
        creator = rng.choice(creators[kind])
        w.facts["creator"] = creator
        w.facts["work_year"] = min(2020, ents[creator].facts["birth_year"] + rng.randint(20, 60))
        pool = orgs_of[WORK_KINDS[kind].category]
        existing = [o for o in pool if ents[o].facts["org_founded"] <= w.facts["work_year"]]  # no anachronisms
        if not existing:  # older than every such organisation: it appeared once the first one existed
            existing = [min(pool, key=lambda o: ents[o].facts["org_founded"])]
            w.facts["work_year"] = ents[existing[0]].facts["org_founded"] + rng.randint(0, 10)
        w.facts["publisher"] = rng.choice(existing)
    return World(ents, by_kind)


# --- articles -----------------------------------------------------------------------------------------

def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _sentences_person(e: Entity, w: World, rng: random.Random) -> list[str]:
    f, pr, n = e.facts, e.info["pronoun"], e.name
    city = w.get(f["birthplace"])
    country = w.get(city.facts["country"]).name
    s = [f"{n} is {_a(e.info['occupation'])} from {country}.",
         rng.choice((f"{pr} was born in {city.name} in {f['birth_year']}.",
                     f"{pr} was born in {f['birth_year']} in the city of {city.name}.")),
         # career, works and foundings come before the mentor and university, so that a 48-word
         # snippet does not always reach them and the page must be read (as on the real web)
         rng.choice((f"{pr} spent {rng.randint(3, 12)} years working in {w.get(rng.choice(w.by_kind['city'])).name} "
                     "before returning home.",
                     f"{'Her' if pr == 'She' else 'His'} early work drew on the folk songs of "
                     f"{w.get(rng.choice(w.by_kind['country'])).name}.",
                     f"{pr} corresponded for decades with {w.get(rng.choice(w.by_kind['person'])).name}."))]
    works = [x for x in w.by_kind["work"] if w.get(x).facts["creator"] == e.id][:3]
    if works:
        s.append(f"{pr} is best known for {_listing([w.get(x).name for x in works])}.")
    founded = [o for o in w.by_kind["org"] if w.get(o).facts["founder"] == e.id][:2]
    for o in founded:
        s.append(f"In {w.get(o).facts['org_founded']}, {pr.lower()} founded {w.get(o).name}.")
    if "mentor" in f:
        m = w.get(f["mentor"])
        s.append(rng.choice((f"{pr} studied under {m.name}.",
                             f"{pr} trained under the {m.info['occupation']} {m.name}.")))
    if "alma_mater" in f:
        s.append(rng.choice((f"{pr} attended {w.get(f['alma_mater']).name}.",
                             f"{pr} was educated at {w.get(f['alma_mater']).name}.")))
    s.append(rng.choice((f"{pr} later settled in {w.get(rng.choice(w.by_kind['city'])).name}.",
                         f"Critics have compared {'her' if pr == 'She' else 'his'} work to that of "
                         f"{w.get(rng.choice(w.by_kind['person'])).name}.",
                         f"{pr} travelled widely and kept detailed notebooks.")))
    return s


def _sentences_org(e: Entity, w: World, rng: random.Random) -> list[str]:
    f, n = e.facts, e.name
    noun = ORG_KINDS[e.info["category"]][0]
    hq, founder = w.get(f["hq"]).name, w.get(f["founder"]).name
    s = rng.choice((
        [f"{n} is {_a(noun)} based in {hq}.", f"It was founded in {f['org_founded']} by {founder}."],
        [f"Founded by {founder} in {f['org_founded']}, {n} is {_a(noun)} headquartered in {hq}."]))
    works = [x for x in w.by_kind["work"] if w.get(x).facts["publisher"] == e.id][:2]
    if works:
        verb = WORK_KINDS[w.get(works[0]).info["work_kind"]].pub
        names = [w.get(x).name for x in works]
        s.append(f"Among the works it {verb} {'are' if len(names) > 1 else 'is'} {_listing(names)}.")
    s.append(rng.choice((f"Its archive holds letters by {w.get(rng.choice(w.by_kind['person'])).name}.",
                         "It moved into its present building after a fire destroyed the first one.",
                         f"It is funded by a trust set up in {rng.randint(1850, 2000)}.")))
    return s


def _sentences_work(e: Entity, w: World, rng: random.Random) -> list[str]:
    f, n, kind = e.facts, e.name, e.info["work_kind"]
    made, pub = WORK_KINDS[kind].made, WORK_KINDS[kind].pub
    creator, publisher = w.get(f["creator"]).name, w.get(f["publisher"]).name
    s = [rng.choice((f"{n} is {_a(kind)} by {creator}, {made} in {f['work_year']}.",
                     f"{n} ({f['work_year']}) is {_a(kind)} by {creator}.")),
         rng.choice((f"It was first {pub} by {publisher}.", f"It was {pub} by {publisher}."))]
    s.append(rng.choice(("It was poorly received at first and admired only decades later.",
                         f"A revised version appeared in {f['work_year'] + rng.randint(2, 15)}.",
                         "Its opening is often quoted.")))
    return s


def _sentences_city(e: Entity, w: World, rng: random.Random) -> list[str]:
    f, n = e.facts, e.name
    country = w.get(f["country"]).name
    s = [rng.choice((f"{n} is a city in {country}.",
                     f"{n} is a town in the {rng.choice(('north', 'south', 'east', 'west'))} of {country}.")),
         f"It was founded in {f['city_founded']}."]
    orgs = [o for o in w.by_kind["org"] if w.get(o).facts["hq"] == e.id][:2]
    if orgs:
        s.append(f"{n} is home to {_listing([w.get(o).name for o in orgs])}.")
    s.append(rng.choice(("A river crosses the old town.", "Its market square dates from the founding.",
                         "The city is known for its bridges.")))
    return s


def _sentences_country(e: Entity, w: World, rng: random.Random) -> list[str]:
    n, form, cap = e.name, e.info["form"], w.get(e.facts["capital"]).name
    cities = [c for c in w.by_kind["city"] if w.get(c).facts["country"] == e.id and c != e.facts["capital"]][:3]
    s = [rng.choice((f"{n}, officially the {form} of {n}, is a country whose capital is {cap}.",
                     f"{n} (the {form} of {n}) is a country. Its capital is {cap}."))]
    if cities:
        s.append(f"Other cities include {_listing([w.get(c).name for c in cities])}.")
    return s


_SENTENCES = {"person": _sentences_person, "org": _sentences_org, "work": _sentences_work,
              "city": _sentences_city, "country": _sentences_country}


def render_articles(world: World, seed: int) -> list[dict]:
    rng = random.Random(f"demo-articles:{seed}")
    out = []
    for kind in ("country", "city", "person", "org", "work"):
        for eid in world.by_kind[kind]:
            e = world.get(eid)
            out.append({"id": e.id, "title": e.name, "contents": " ".join(_SENTENCES[kind](e, world, rng))})
    return out


# --- relations and questions -----------------------------------------------------------------------------

NAME = r"[A-Z][a-z]+(?: [A-Z][a-z]+)*"   # invented names are capitalised words, no digits
YEAR = r"\d{3,4}"


@dataclass(frozen=True)
class Relation:
    name: str
    domain: str
    range: str                    # an entity kind or "year"
    noun: tuple[str, ...]         # "{s}" described through this relation: "the founder of {s}"
    ask: tuple[str, ...]          # final questions about {s}
    goal: str                     # what the expert is looking for, in its own words
    queries: tuple[str, ...]      # the expert's search phrasings
    patterns: tuple[str, ...]     # regexes over the subject's article; group `v` is the value
    states: str                   # the fact as the expert restates it


REL = {r.name: r for r in [
    Relation("birthplace", "person", "city", ("the birthplace of {s}", "the home town of {s}"),
             ("Where was {s} born?", "In which city was {s} born?"), "where {s} was born",
             ("{s} born", "where was {s} born", "{s} birthplace"),
             (rf"born in (?P<v>{NAME}) in {YEAR}", rf"born in {YEAR} in the city of (?P<v>{NAME})"),
             "{s} was born in {v}"),
    Relation("birth_year", "person", "year", (), ("In what year was {s} born?", "When was {s} born?"),
             "when {s} was born", ("{s} born", "when was {s} born", "{s} birth year"),
             (rf"born in {NAME} in (?P<v>{YEAR})", rf"born in (?P<v>{YEAR})"), "{s} was born in {v}"),
    Relation("mentor", "person", "person", ("the mentor of {s}", "the teacher of {s}"),
             ("Who was the mentor of {s}?", "Under whom did {s} study?"), "who taught {s}",
             ("{s} studied under", "{s} mentor", "who taught {s}"),
             (rf"(?:studied|trained) under (?:the [a-z]+ )?(?P<v>{NAME})",), "{s} studied under {v}"),
    Relation("alma_mater", "person", "org", ("the university {s} attended",),
             ("Which university did {s} attend?", "Where was {s} educated?"), "which university {s} attended",
             ("{s} attended", "{s} educated at", "{s} university"),
             (rf"(?:attended|educated at) (?P<v>{NAME})",), "{s} attended {v}"),
    Relation("country", "city", "country", ("the country in which {s} lies",),
             ("In which country is {s}?", "In which country does {s} lie?"), "which country {s} is in",
             ("{s} country", "which country is {s} in", "{s} city in"),
             (rf"(?:city|town) in (?:the [a-z]+ of )?(?P<v>{NAME})",), "{s} lies in {v}"),
    Relation("city_founded", "city", "year", (), ("In what year was {s} founded?", "When was {s} founded?"),
             "when {s} was founded", ("{s} founded", "when was {s} founded"),
             (rf"[Ff]ounded in (?P<v>{YEAR})",), "{s} was founded in {v}"),
    Relation("capital", "country", "city", ("the capital of {s}",),
             ("What is the capital of {s}?", "Which city is the capital of {s}?"), "the capital of {s}",
             ("{s} capital", "capital of {s}"), (rf"[Cc]apital is (?P<v>{NAME})",), "the capital of {s} is {v}"),
    Relation("founder", "org", "person", ("the founder of {s}",), ("Who founded {s}?", "Who is the founder of {s}?"),
             "who founded {s}", ("{s} founder", "who founded {s}", "{s} founded by"),
             (rf"[Ff]ounded (?:in {YEAR} )?by (?P<v>{NAME})",), "{s} was founded by {v}"),
    Relation("hq", "org", "city", ("the home city of {s}",),
             ("In which city is {s} based?", "Where is {s} headquartered?"), "where {s} is based",
             ("{s} based in", "where is {s} headquartered", "{s} headquarters"),
             (rf"(?:based|headquartered) in (?P<v>{NAME})",), "{s} is based in {v}"),
    Relation("org_founded", "org", "year", (), ("In what year was {s} founded?", "When was {s} established?"),
             "when {s} was founded", ("{s} founded", "when was {s} founded", "{s} founded in"),
             (rf"[Ff]ounded (?:by {NAME} )?in (?P<v>{YEAR})",), "{s} was founded in {v}"),
    Relation("creator", "work", "person", ("the {maker} of {s}",), ("Who {active} {s}?",),
             "who {active} {s}", ("{s} {kind} by", "who {active} {s}", "{s} {maker}"),
             (rf"(?:novel|collection|symphony|painting) by (?P<v>{NAME})",), "{s} is by {v}"),
    Relation("publisher", "work", "org", ("the {org} that {pub} {s}",), ("Which {org} {pub} {s}?",),
             "which {org} {pub} {s}", ("{s} {pub} by", "who {pub} {s}", "{s} {org}"),
             (rf"(?:published|premiered|exhibited) by (?P<v>{NAME})",), "{s} was {pub} by {v}"),
    Relation("work_year", "work", "year", (), ("In what year was {s} {made}?", "When was {s} {made}?"),
             "when {s} was {made}", ("{s} {made} in", "when was {s} {made}", "{s} {kind} year"),
             (rf"(?:written|composed|painted) in (?P<v>{YEAR})", rf"\((?P<v>{YEAR})\)"), "{s} was {made} in {v}"),
]}
OUT_OF = {kind: [r for r in REL.values() if r.domain == kind] for kind in ("person", "city", "country", "org", "work")}
INVERSE = {("capital", "country"), ("country", "capital")}  # a chain that walks back to where it began


def kind_words(e: Entity) -> dict:
    """Words that depend on a work's kind (author/composer, published/premiered, ...)."""
    if e.kind != "work":
        return {}
    wk = WORK_KINDS[e.info["work_kind"]]
    return {"maker": wk.maker, "made": wk.made, "active": wk.active, "org": ORG_KINDS[wk.category][0],
            "pub": wk.pub, "kind": e.info["work_kind"]}


@dataclass
class Question:
    id: str
    question: str
    golden_answers: list[str]
    data_source: str
    anchor: str                 # entity id named in the question
    chain: list[str]            # relation names, first hop first
    path: list                  # entity ids visited (anchor first); the answer's id or year last

    def row(self) -> dict:
        return {"id": self.id, "question": self.question, "golden_answers": self.golden_answers,
                "data_source": self.data_source}


def answer_aliases(world: World, value) -> list[str]:
    if isinstance(value, int):
        return [str(value)]
    e = world.get(value)
    if e.kind == "person":
        return [e.name, e.name.split()[-1]]
    if e.kind == "country":
        return [e.name, f"{e.info['form']} of {e.name}"]
    return [e.name]


def make_question(world: World, hops: int, rng: random.Random) -> Question | None:
    """One random chain of `hops` relations from a random anchor; None when the walk dead-ends."""
    kind = rng.choice(("person", "org", "work", "work", "city", "country") if hops > 1 else
                      ("person", "org", "work", "city", "country"))
    anchor = rng.choice(world.by_kind[kind])
    chain, path = [], [anchor]
    for i in range(hops):
        here = path[-1]  # an entity id: years are only reachable on the last hop
        options = [r for r in OUT_OF[world.get(here).kind] if r.name in world.get(here).facts
                   and (i == hops - 1 or r.range != "year") and (not chain or (chain[-1], r.name) not in INVERSE)]
        if not options:
            return None
        r = rng.choice(options)
        chain.append(r.name)
        path.append(world.get(here).facts[r.name])
    if len(set(map(str, path))) != len(path):  # visits an entity twice (e.g. a mentor loop)
        return None
    a = world.get(anchor)
    desc = a.name
    for rel in chain[:-1]:
        desc = rng.choice(REL[rel].noun).format(s=desc, **kind_words(a))
    q = rng.choice(REL[chain[-1]].ask).format(s=desc, **kind_words(a))
    q = q[0].upper() + q[1:]
    return Question("", q, answer_aliases(world, path[-1]), f"demo_{hops}hop", anchor, chain, path)


def make_questions(world: World, n: int, seed: int) -> list[Question]:
    """`n` distinct questions (by text), hop counts drawn with HOP_WEIGHTS."""
    rng = random.Random(f"demo-questions:{seed}")
    seen, out, tries = set(), [], 0
    while len(out) < n:
        hops = rng.choices((1, 2, 3, 4), HOP_WEIGHTS)[0]
        while True:  # keep the drawn hop count: long walks dead-end more often
            tries += 1
            if tries > 100 * n + 1000:
                raise InputError(f"the world has too few distinct questions for {n}",
                                 hint="raise --articles or lower --train/--test")
            q = make_question(world, hops, rng)
            if q is not None and q.question not in seen:
                seen.add(q.question)
                out.append(q)
                break
    return out


def split_questions(qs: list[Question], test: int) -> tuple[list[Question], list[Question]]:
    """(train, test): the first `test` questions are the test split; ids `test_i`, `train_i`."""
    test_q, train_q = qs[:test], qs[test:]
    for i, q in enumerate(test_q):
        q.id = f"test_{i}"
    for i, q in enumerate(train_q):
        q.id = f"train_{i}"
    return train_q, test_q


def generate(seed: int, articles_n: int, train: int, test: int) -> tuple[World, list[Question], list[Question]]:
    """The world and its question splits; test ids `test_i`, train ids `train_i`."""
    world = build_world(seed, articles_n)
    train_q, test_q = split_questions(make_questions(world, train + test, seed), test)
    return world, train_q, test_q


# --- the scripted expert ----------------------------------------------------------------------------------

RESULT_RE = re.compile(r"^\d+\. (?P<title>.*)\n   url: (?P<url>\S*)\n   (?P<snippet>.*)$", re.M)

OBS = ("The {t} article says {fact}.", "According to its article, {fact}.", "The result for {t} states that {fact}.")
# after a quote (stepwise-real): the fact in the relation's words, since the quoted sentence often names neither the
# relation nor the entity ("He was born in Vedar in 1829"), and the stepwise rewrite reads the hop from it
RESTATE = ("So {fact}.", "That is, {fact}.", "This means {fact}.")
# the quote comes after the hop's goal: a policy that has not read the value yet picks the sentence by what it looks
# for (session 29: quoting without it, the policy quoted the snippet's first sentence whatever the question asked)
QUOTE_FOR = ("For {goal}, the page says \"{quote}\".", "On {goal}: \"{quote}\".",
             "About {goal}, it reads \"{quote}\".", "Looking for {goal}, the text states \"{quote}\".")
PLAN_FIRST = ("This is a {h}-hop question. First find {goal}.",
              "Break the question into {h} lookups, starting with {goal}.",
              "The chain has {h} links; the first is {goal}.")
PLAN_ONE = ("Find {goal}.", "Look up {goal} directly.")
PLAN_NEXT = ("Next find {goal}.", "Now look up {goal}.", "The next link is {goal}.")
ACTION_SEARCH = ("Search for {goal}.", "Run a web search on {goal}.")
HYPOTHESIS = ("If {v} is right, its own article should say {goal}.",
              "Assume {v} is the right entity; its article should answer {goal}.")
RISK = ("Other results mention {t} too; I rely only on its own article.",
        "A similar name could mislead me, so I take the fact from the article titled {t}.")
VERIFY = ("The result title matches {t} exactly, so the fact belongs to it.",
          "The article is about {t} itself, not a namesake.")
REFLECT_END = ("All {h} links are resolved: {chain}.", "The chain {chain} answers the question.")
SNIPPET_SHORT = ("The snippet of the {t} article stops before it says {goal}.",
                 "The {t} result is right, but its snippet does not show {goal}.")
NOT_FOUND = ("None of the results is the article on {t}; the query was too broad.",
             "The results do not include an article titled {t}.")
# the stepwise expert (style "stepwise"): no hop count, the question rewritten after each fact
PLAN_START = ("Start with {goal}.", "First find {goal}.", "Look up {goal} first.")
REWRITTEN = ("The question is now: {q}", "What remains to answer: {q}", "With {v} known, the question becomes: {q}")
ANSWERED = ("{v} answers the question.", "That settles it: the answer is {v}.",
            "Nothing is left to look up; the answer is {v}.")


def question_descs(q: Question, world: World) -> list[str]:
    """The descriptions the question nests, innermost first: descs[i] names path[i] ("Dridroth Books",
    "the founder of Dridroth Books"); the question is the last relation's `ask` about descs[-1].
    Recovered from the text, since make_question drew one of several nouns per relation."""
    words = kind_words(world.get(q.anchor))
    descs = [world.get(q.anchor).name]
    for rel in q.chain[:-1]:
        nouns = [n.format(s=descs[-1], **words) for n in REL[rel].noun]
        hit = [n for n in nouns if n in q.question]
        if len(hit) != 1:
            raise ValueError(f"{q.id}: cannot find how {q.question!r} describes {rel} of {descs[-1]!r}")
        descs.append(hit[0])
    return descs


class Expert:
    """Solves demo questions with the real tools, one hop per turn, writing atomic thoughts."""

    def __init__(self, toolbox, world: World, seed: int, *, stepwise: bool = False, quote: bool = False):
        # quote (stepwise-real): each fact is observed as the tool output's own sentence, as the real-text
        # expert does, instead of the fact template "The result for X states that ..." (which the policy filled
        # with its own query on real text and answered with that query, bench/LEARNING.md session 27); a
        # REFLECTION then restates the quoted fact in the relation's words (session 28: quotes alone lost the hops)
        self.tb, self.world, self.seed, self.stepwise, self.quote = toolbox, world, seed, stepwise, quote

    def solve(self, q: Question) -> dict:
        from atomcli.agent import format as af
        from atomcli.demo import research_expert as rx  # it imports this module
        rng = random.Random(f"demo-expert:{self.seed}:{q.id}")
        traj_id = f"{q.id}/0"
        msgs = [{"role": "system", "content": af.system_prompt(date=SYSTEM_DATE)},
                {"role": "user", "content": af.user_message(q.question)}]
        calls: list[dict] = []
        anchor = self.world.get(q.anchor)
        words = kind_words(anchor)
        subject, found = anchor.name, [anchor.name]  # found: the chain as read from the tools

        def goal(i: int, s: str) -> str:
            return REL[q.chain[i]].goal.format(s=s, **words)

        def act(units: list[tuple[str, str]], name: str, args: dict) -> str:
            call = {"name": name, "arguments": args}
            think = "".join(f"<{t}>{x}</{t}>" for t, x in units)
            raw = json.dumps(call, ensure_ascii=False)
            msgs.append({"role": "assistant", "content": f"<think>{think}</think><tool_call>{raw}</tool_call>"})
            parsed = af.parse_tool_call(raw)  # exactly what a rollout would parse from this turn
            res = self.tb.run(parsed, traj_id)
            calls.append({"turn": sum(m["role"] == "assistant" for m in msgs), "name": name,
                          "arguments": json.dumps(parsed.arguments, ensure_ascii=False), "ok": bool(res.ok),
                          "error": res.error, "cached": bool(res.cached),
                          "seconds": None})  # wall time would make the file differ run to run
            msgs.append({"role": "tool", "content": af.tool_message(res.observation)})
            return res.observation

        h = len(q.chain)
        if self.stepwise:
            descs = question_descs(q, self.world)
            units = [("PLAN", rng.choice(PLAN_START).format(goal=goal(0, subject)))]
        else:
            units = [("PLAN", rng.choice(PLAN_FIRST if h > 1 else PLAN_ONE).format(h=h, goal=goal(0, subject)))]
        for i, rel_name in enumerate(q.chain):
            rel = REL[rel_name]
            g = goal(i, subject)
            units.append(("ACTION", rng.choice(ACTION_SEARCH).format(goal=g)))
            query = rng.choice(rel.queries).format(s=subject, **words)
            obs = act(units, "web_search", {"query": [query]})
            value, own, where = self._read(rel, subject, obs, snippet=True)
            units = []
            if own is None:  # the subject's article was not in the top results: search the bare name
                units = [("REFLECTION", rng.choice(NOT_FOUND).format(t=subject)),
                         ("PLAN", f"Search for the name {subject} alone."),
                         ("ACTION", f"Search for {subject}.")]
                obs = act(units, "web_search", {"query": [subject]})
                value, own, where = self._read(rel, subject, obs, snippet=True)
                units = []
            if value is None and own is not None:  # the snippet stops short: read the page
                units = [("OBSERVATION", rng.choice(SNIPPET_SHORT).format(t=subject, goal=g)),
                         ("PLAN", "Open the article and read it in full."),
                         ("ACTION", f"Browse {own}.")]
                obs = act(units, "browse_webpage", {"url_list": [own], "query": g})
                value, _, where = self._read(rel, subject, obs, snippet=False)
                units = []
            if value is None:
                units = [("REFLECTION", f"I could not find {g} in what the tools returned.")]
                break
            fact = rel.states.format(s=subject, v=value, **words)
            said = rx.quote(where, value, [subject]) if self.quote else None
            # one rng draw either way, so the styles without quotes keep their bytes
            units.append(("OBSERVATION", rng.choice(QUOTE_FOR).format(goal=g, quote=said) if said
                          else rng.choice(OBS).format(t=subject, fact=fact)))
            if said:  # the quote, then the fact it gives (an extra draw only in the quoting style)
                units.append(("REFLECTION", rng.choice(RESTATE).format(fact=fact)))
            # with a quote and its restatement the optional checks (and below, the next hop's PLAN) are left out:
            # a turn must fit the rollout's max_new_tokens (192); quote + restatement + checks + the rewritten
            # question overran it in 1 turn of 10, which the policy then copied and cut short (LEARNING.md s29)
            # (the same rng draws either way, so the other styles keep their bytes)
            checks = []
            if rng.random() < 0.3:
                checks.append(("VERIFICATION", rng.choice(VERIFY).format(t=subject)))
            if rng.random() < 0.25:
                checks.append(("RISK_ANALYSIS", rng.choice(RISK).format(t=subject)))
            if not said:
                units += checks
            subject = value
            found.append(value)
            if self.stepwise:  # the question with this fact in place, or the fact answers it
                if i + 1 < h:
                    rewritten = q.question.replace(descs[i + 1], value, 1)
                    units.append(("REFLECTION", rng.choice(REWRITTEN).format(q=rewritten, v=value)))
                    plan = ("PLAN", rng.choice(PLAN_NEXT).format(goal=goal(i + 1, value)))
                    if not said:  # with a quote, the ACTION alone names the next goal (length)
                        units.append(plan)
                else:
                    units.append(("REFLECTION", rng.choice(ANSWERED).format(v=value)))
                continue
            if i + 1 < h:
                if rng.random() < 0.35:
                    hyp = rng.choice(HYPOTHESIS).format(v=value, goal=goal(i + 1, value))
                    units.append(("HYPOTHESIS_TESTING", hyp))
                units.append(("PLAN", rng.choice(PLAN_NEXT).format(goal=goal(i + 1, value))))
        answer = found[-1] if len(found) == h + 1 else "unknown"
        if answer != "unknown" and h > 1 and not self.stepwise:
            units.append(("REFLECTION", rng.choice(REFLECT_END).format(h=h, chain=" -> ".join(found))))
        think = "".join(f"<{t}>{x}</{t}>" for t, x in units)
        msgs.append({"role": "assistant", "content": f"<think>{think}</think><answer>{answer}</answer>"})
        n_turns = sum(m["role"] == "assistant" for m in msgs)
        self.tb.forget(traj_id)
        return {**q.row(), "traj_id": traj_id, "group_id": q.id, "sample_idx": 0, "policy": "scripted-expert",
                "messages": msgs, "answer": answer, "finish_reason": "answer",
                "format_ok": af.trajectory_format_ok(msgs), "n_turns": n_turns,
                "n_search": sum(c["name"] == "web_search" for c in calls),
                "n_browse": sum(c["name"] == "browse_webpage" for c in calls), "tool_calls": calls}

    @staticmethod
    def _read(rel: Relation, subject: str, obs: str, *,
              snippet: bool) -> tuple[str | None, str | None, str | None]:
        """(value, url of the subject's own article, the text that states the value) from an observation;
        None where absent.

        From search results only the result titled `subject` counts, and a value cut off by the
        snippet's end (`…`) does not; from a browsed page the whole text counts."""
        own = None
        texts = []
        if snippet:
            for m in RESULT_RE.finditer(obs):
                if m["title"] == subject:
                    own = own or m["url"]
                    texts.append(m["snippet"])
        else:
            texts = [obs]
        for text in texts:
            for pat in rel.patterns:
                m = re.search(pat + r"(?=[.,;:)]| [a-z(]|\s*$)", text)  # a value then a clause boundary
                if m:
                    return m["v"], own, text
        return None, own, None


# --- files --------------------------------------------------------------------------------------------------

def _jsonl(rows: list[dict]) -> bytes:
    import orjson
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def sft_table(rows: list[dict], config: dict):
    """The SFT rows as a trajectory table with contract types and a time-free provenance record."""
    import pyarrow as pa

    from atomcli import schema
    cols = ["id", "question", "golden_answers", "data_source", "traj_id", "group_id", "sample_idx", "policy",
            "messages", "answer", "finish_reason", "format_ok", "n_turns", "n_search", "n_browse", "tool_calls"]
    table = pa.table({c: schema.array(c, [r[c] for r in rows]) for c in cols})
    # schema.with_provenance stamps the wall time; demo-world files must be byte-identical per seed
    rec = {"stage": "demo-world", "version": __version__, "time": None, "config": config}
    return table.replace_schema_metadata({schema.META_KEY: json.dumps({"provenance": [rec]}).encode()})


def check_sizes(articles: int, train: int, test: int, sft: int) -> None:
    if articles < MIN_ARTICLES:
        raise InputError(f"--articles {articles} is too small", hint=f"use at least {MIN_ARTICLES}")
    if min(train, test, sft) < 0 or train + test == 0:
        raise InputError("--train, --test and --sft must be >= 0 and there must be some questions")
    if sft > train:
        raise InputError(f"--sft {sft} exceeds --train {train}", hint="SFT questions come from the train split only")


def expert_trajectories(spec: str, ctx, make_expert, questions, golden, limit: int | None = None,
                        snippets: str = search_local.PAGE_ORDER):
    """SFT rows an expert writes with the real tools over the index `spec`: up to `limit` rows that are
    well formed and answer exactly (F1 1), and how many were dropped. `make_expert(toolbox)` builds the
    expert, `golden(question)` gives its golden answers; `snippets` is the index's snippet order (the
    `snippets=` search option its rollouts will use). The ToolBox is closed and its cached search
    forgotten afterwards: the index lives in a folder about to be renamed or deleted."""
    from atomcli.env.tools import ToolBox
    from atomcli.rewards import metrics
    rows, dropped = [], 0
    options = search_local.snippet_options(snippets)
    toolbox = ToolBox(spec, ctx, k=SFT_K, search_options=options)
    try:
        expert = make_expert(toolbox)
        for q in questions:
            if limit is not None and len(rows) >= limit:
                break
            row = expert.solve(q)
            if row and row["format_ok"] and metrics.f1(row["answer"], golden(q)) == 1.0:
                rows.append(row)
            else:
                dropped += 1
    finally:
        toolbox.close()
        toolbox.backend.close()
        ctx.forget_search(spec, **options)
    return rows, dropped


def main(out: str, *, seed: int = 0, articles: int = 2400, train: int = 400, test: int = 100, sft: int = 200,
         style: str = "classic", snippets: str = search_local.PAGE_ORDER, context=None) -> dict:
    """Write the demo world into the folder `out` (replaced atomically); return a summary.

    `style` "research" writes the world and SFT mix of `research_world` instead (issue 20);
    "stepwise" this module's world with the stepwise expert's SFT set (module docstring); the
    default, "classic", is this module's world, unchanged so that earlier runs reproduce.
    `snippets`: the search results' snippet order the experts see (search_local.SNIPPET_ORDERS); train
    and evaluate on the world with the same `--search-options snippets=...`."""
    from atomcli import tableio
    from atomcli.context import Context
    from atomcli.demo import real_docs, real_sft

    if style not in STYLES:
        raise unknown_choice("demo-world style", style, STYLES)
    search_local.check_snippet_order(snippets)  # before anything is built
    if snippets != search_local.PAGE_ORDER and style not in ("stepwise", "stepwise-real"):
        raise InputError(f"--snippets {snippets} is for the stepwise styles", hint="use --style stepwise-real")
    ctx = context or Context(quiet=True)
    if style == "research":
        from atomcli.demo import research_world
        return research_world.main(out, seed=seed, articles=articles, train=train, test=test, sft=sft, context=ctx)
    stepwise = style in ("stepwise", "stepwise-real")
    real = REAL_MIX if style == "stepwise-real" else ""
    check_sizes(articles, train, test, sft)
    dest = Path(out)
    from atomcli import safety
    safety.check_output(dest, safety.DEMO_WORLD)  # never replaces a folder that is not a demo world
    world, train_q, test_q = generate(seed, articles, train, test)
    docs = render_articles(world, seed)
    # the real part (stepwise-real): one corpus and index for both kinds of question, the real train split
    # after the demo's in train.jsonl (run-all's steps draw both), the test split never read
    real_passages, real_train = real_docs.train_part(real)
    config = {"seed": seed, "articles": articles, "train": train, "test": test, "sft": sft, "k": SFT_K,
              "date": SYSTEM_DATE, **({"style": style} if stepwise else {}),  # classic: the bytes it always had
              **search_local.snippet_options(snippets)}
    with tableio.atomic_dir(dest) as tmp:
        (tmp / "corpus.jsonl").write_bytes(_jsonl(docs + real_passages))
        (tmp / "train.jsonl").write_bytes(_jsonl([q.row() for q in train_q] + real_train))
        (tmp / "test.jsonl").write_bytes(_jsonl([q.row() for q in test_q]))
        index = str(tmp / "index.sqlite")
        search_local.build_index(str(tmp / "corpus.jsonl"), index)
        spec = "local:" + index
        rows, dropped = expert_trajectories(
            spec, ctx, lambda tools: Expert(tools, world, seed, stepwise=stepwise, quote=bool(real)), train_q,
            lambda q: q.golden_answers, limit=sft, snippets=snippets)
        real_rows, real_dropped = [], 0
        if real:  # searched in this world's own index: the observations its rollouts of these questions get
            real_rows, real_dropped = real_sft.trajectories(real, seed=seed, context=ctx, spec=spec, snippets=snippets)
            rows = rows + real_rows
            random.Random(f"stepwise-real-mix:{seed}").shuffle(rows)  # SFT batches see both kinds of question
            config.update(real=real, real_sft=len(real_rows), real_train=len(real_train),
                          real_passages=len(real_passages))
        (tmp / "sft.parquet").write_bytes(tableio.table_bytes(sft_table(rows, config), "parquet"))
    hops = {f"demo_{h}hop": sum(q.data_source == f"demo_{h}hop" for q in train_q + test_q) for h in (1, 2, 3, 4)}
    ctx.log(f"[green]wrote[/] {out}: {len(docs):,} articles, {len(train_q)} train / {len(test_q)} test questions "
            f"({', '.join(f'{k}: {v}' for k, v in hops.items())}), {len(rows) - len(real_rows)} SFT trajectories"
            + (f" ({dropped} expert failures dropped)" if dropped else "")
            + (f"; + {len(real_passages):,} real ({real}) passages, {len(real_train)} real train questions, "
               f"{len(real_rows)} real-text SFT trajectories ({real_dropped} dropped)" if real else ""))
    return {"articles": len(docs), "train": len(train_q), "test": len(test_q), "sft": len(rows),
            "dropped": dropped + real_dropped, "hops": hops,
            **({"sft_real": len(real_rows), "real_train": len(real_train), "real_passages": len(real_passages)}
               if real else {})}



# --- a loopback web server for the corpus -------------------------------------------------------------------

def page_html(doc: dict) -> str:
    t = html.escape(doc.get("title", ""))
    body = "".join(f"<p>{html.escape(s)}</p>" for s in re.split(r"(?<=\.) (?=[A-Z])", doc.get("contents", "")))
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title></head>"
            f"<body><article><h1>{t}</h1>{body}</article></body></html>")


def serve(corpus_path: str, host: str = "127.0.0.1", port: int = 0):
    """Serve each article at /doc/<id> (HTML) from a daemon thread; return (server, base_url).

    `server.shutdown()` stops it. The corpus is read once into memory (the demo's is ~1 MB)."""
    import http.server

    import orjson
    docs = {}
    with open(corpus_path, "rb") as f:
        for line in f:
            if line.strip():
                d = orjson.loads(line)
                docs[str(d["id"])] = d

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            path = urllib.parse.urlparse(self.path).path
            doc_id = urllib.parse.unquote(path[5:]) if path.startswith("/doc/") else None
            if doc_id in docs:
                self._send(200, page_html(docs[doc_id]))
            elif path == "/":
                links = "".join(f'<li><a href="/doc/{urllib.parse.quote(i, safe="")}">'
                                f'{html.escape(d.get("title", i))}</a></li>' for i, d in docs.items())
                self._send(200, "<!doctype html><html><head><title>Demo world</title></head>"
                                f"<body><ul>{links}</ul></body></html>")
            else:
                self._send(404, "<!doctype html><html><body><h1>Not found</h1></body></html>")

        def _send(self, code: int, text: str):
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # keep stderr quiet in tests
            pass

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="demo-world-http").start()
    return server, f"http://{host}:{server.server_address[1]}"
