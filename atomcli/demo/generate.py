"""The demo world's generator: a seeded fictional encyclopedia and questions that only searching it can answer.

Everything is invented (names built from syllables, dates, relations), so a pretrained model cannot answer
from memory; the same seed gives the same world, articles and questions.

The world: countries, cities, people, organisations (publishing houses, orchestras, galleries, universities)
and works (novels, poetry collections, symphonies, paintings), linked by functional relations (a person's
birthplace and mentor, an organisation's founder and home city, a work's creator and publisher, ...).
Questions follow a chain of 1-4 relations from a named anchor: "Where was the founder of the publishing
house that published Quessarine Chronicles born?" is 3 hops; "In what year was Orlenic Press founded?" is 1.
Every relation is a function, so every question has one answer.

`generate` gives the world and its train/test questions, `render_articles` the corpus; the scripted
expert that answers them is `atomcli.demo.expert`, the files `atom demo-world` writes come from
`atomcli.demo.world`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from atomcli.errors import InputError

HOP_WEIGHTS = (0.3, 0.3, 0.25, 0.15)  # share of 1..4-hop questions
MIN_ARTICLES = 100

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

